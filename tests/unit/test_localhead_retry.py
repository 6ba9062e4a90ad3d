"""When `gpusession cluster start` / `gpusession lab` try `ray start` again: only after Ray's own
"timed out during startup" (its fixed 30 s window for a new raylet, missed on a loaded machine)."""
from gpusession.cluster.localhead import START_ATTEMPTS, retry_start

MISSED_WINDOW = ("Traceback (most recent call last):\n ...\nException: The current node timed out during startup. "
                 "This could happen because some of the raylet failed to startup or the GCS has become overloaded.\n")


def test_a_missed_start_window_is_tried_again_until_the_last_attempt():
    assert [retry_start(MISSED_WINDOW, attempt) for attempt in range(START_ATTEMPTS)] == (
        [True] * (START_ATTEMPTS - 1) + [False])


def test_any_other_failure_of_ray_start_is_not_tried_again():
    assert not retry_start("ValueError: Ray component dashboard_agent_listen_port is trying to use a port "
                           "number 52365 that is used by other components.\n", 0)
    assert not retry_start("", 0)
