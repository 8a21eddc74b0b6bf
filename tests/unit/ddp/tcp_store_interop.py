"""torch.distributed's TCPStore as the other side of tcp_store_test's interop cases.

  tcp_store_interop.py client PORT  a torch worker (env:// rank 1 of 2) of gradhub's server
  tcp_store_interop.py server       a server hosted by torch, as torchrun's agent hosts it
                                    (world size unknown); prints its port, then serves until
                                    gradhub's client sets cpp/done

Exits 0 when everything gradhub's side did was seen as expected; a failed assert exits 1.
"""

import datetime
import sys
import time

import torch.distributed as dist

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(seconds=20)
FROM_CPP = b"he\x00llo\xff"  # Bytes, not text: a NUL and a byte that is not UTF-8.


def client(port):
    store = dist.TCPStore(HOST, port, 2, False, TIMEOUT)
    got = store.get("from_cpp")  # Blocks until gradhub's server sets it.
    assert got == FROM_CPP, got
    # gradhub added 2 before it set from_cpp; the counter's text is shared.
    total = store.add("counter", 3)
    assert total == 5, total
    store.set("from_py", b"world\x00")


def server():
    store = dist.TCPStore(HOST, 0, None, True, TIMEOUT, wait_for_workers=False)
    store.set("from_py", b"\x00agent")
    store.add("counter", 10)
    print(store.port, flush=True)
    store.wait(["cpp/done"])
    got = store.get("from_cpp")
    assert got == FROM_CPP, got
    assert store.get("counter") == b"11", store.get("counter")
    # gradhub's Set of cpp/done is followed by a check whose reply this process's server thread
    # sends; exiting at once could close the server before it does (a broken pipe there).
    # Nothing tells a c10d server that its clients are done, so give the reply time to go.
    time.sleep(2)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(int(sys.argv[2]))
    else:
        server()
