"""A direct fan-out QoS 0 check outside the harness: 1 publisher sends N
QoS 0 PUBLISH of 64 bytes as fast as its socket takes them, 100 subscribers
read with Python threads, the publisher sends DISCONNECT and closes; prints
how many each subscriber got.

    python bench/fanout_check.py PORT N    # tbmq already listening on PORT
"""
import os, socket, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tbmq.mqtt import Connect, Subscribe, SubscriptionRequest, Publish, Disconnect
from tbmq.mqtt.codec import encode
port = int(sys.argv[1]); N = int(sys.argv[2]); SUBS = 100
counts = [0]*SUBS
socks = []
for i in range(SUBS):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(encode(Connect(client_id=f"s{i}")) + encode(Subscribe(1, [SubscriptionRequest("t", 0)])))
    s.recv(100); socks.append(s)
time.sleep(0.5)
msg = encode(Publish("t", b"x"*64))
L = len(msg)
def reader(i, s):
    buf = 0
    s.settimeout(5)
    try:
        while True:
            d = s.recv(1 << 20)
            if not d: break
            buf += len(d)
    except socket.timeout:
        pass
    counts[i] = buf // L
ths = [threading.Thread(target=reader, args=(i, s)) for i, s in enumerate(socks)]
[t.start() for t in ths]
p = socket.create_connection(("127.0.0.1", port))
p.sendall(encode(Connect(client_id="pub")))
p.recv(100)
blob = msg * 1000
t0 = time.time()
for _ in range(N // 1000):
    p.sendall(blob)
print("sent in", time.time() - t0); p.sendall(encode(Disconnect())); p.close()
[t.join() for t in ths]
print("expected", N, "min", min(counts), "max", max(counts))
p.close()
