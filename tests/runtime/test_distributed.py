import pytest

from jaxlib_ext.core import distributed


def test_single_process_defaults_and_noop():
    cfg = distributed.resolve(env={})
    assert cfg == distributed.ProcessConfig(None, 1, 0) and not cfg.is_multiprocess
    assert distributed.initialize(num_processes=1, process_id=0).num_processes == 1


def test_environment_and_flag_precedence():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
           "JAX_PROCESS_ID": "3"}
    assert distributed.resolve(env=env) == distributed.ProcessConfig("10.0.0.1:1234", 4, 3)
    assert distributed.resolve(process_id=1, env=env).process_id == 1


@pytest.mark.parametrize(
    "kw, argument",
    [({"num_processes": 0}, "^num_processes "),
     ({"num_processes": 2, "process_id": 2, "coordinator": "h:1"}, "^process_id "),
     ({"num_processes": 2, "process_id": 0}, "^coordinator ")],
)
def test_bad_process_arguments_name_the_argument(kw, argument):
    with pytest.raises(ValueError, match=argument):
        distributed.resolve(env={}, **kw)
