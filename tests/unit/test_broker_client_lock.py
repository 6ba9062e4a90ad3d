"""broker() holds the client's lock while it asks a found broker for its version through call();
when that broker dies meanwhile, call() forgets the handle (taking the lock again) and looks it up
anew. With a plain Lock that thread deadlocked, and every other thread of the kernel with it."""
import threading

from gpusession.broker import client


def test_forgetting_the_handle_while_looking_it_up_returns():
    done = threading.Event()

    def lookup_whose_broker_died():
        with client._lock:  # as broker() holds it around _get_or_create
            client.forget()  # as call() does on RayActorError
            done.set()

    thread = threading.Thread(target=lookup_whose_broker_died, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert done.is_set(), "forget() inside the handle lookup never returned (the client's lock is not reentrant)"
