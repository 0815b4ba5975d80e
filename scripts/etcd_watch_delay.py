#!/usr/bin/env python3
"""Measures etcd's delivery delay for a watch opened from a past revision, against one
opened from the next revision (measured: BENCHMARKS.md's history, `git log -p BENCHMARKS.md`). etcd puts a watcher
whose start revision is already in its history into the "unsynced" group, which a loop
catches up every 100 ms; a watcher from the next revision is "synced" and gets events at
once. The rendezvous opens its state watch from `seen + 1` after its own write moved the
revision on, so it pays the first kind. Starts its own etcd; no dependencies.

usage: scripts/etcd_watch_delay.py
"""
import base64, json, os, socket, subprocess, tempfile, threading, time, urllib.request, statistics
def free():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
c,pp=free(),free(); d=tempfile.mkdtemp(dir="/dev/shm")
e=subprocess.Popen(["etcd","--data-dir",d+"/x","--listen-client-urls",f"http://127.0.0.1:{c}","--advertise-client-urls",f"http://127.0.0.1:{c}","--listen-peer-urls",f"http://127.0.0.1:{pp}","--initial-advertise-peer-urls",f"http://127.0.0.1:{pp}","--initial-cluster",f"default=http://127.0.0.1:{pp}"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
B=lambda s: base64.b64encode(s.encode()).decode()
def post(path, body):
    r=urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{c}{path}",data=json.dumps(body).encode()),timeout=5); return json.loads(r.read())
for _ in range(100):
    try: post("/v3/kv/range",{"key":B("x")}); break
    except Exception: time.sleep(0.1)
def put(k): return int(post("/v3/kv/put",{"key":B(k),"value":B("v")})["header"]["revision"])
def rev(): return int(post("/v3/kv/range",{"key":B("x")})["header"]["revision"])
def watch_first_event(key, start, t_holder):
    r=urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{c}/v3/watch",data=json.dumps({"create_request":{"key":B(key),"start_revision":start}}).encode()),timeout=5)
    while True:
        line=r.readline()
        m=json.loads(line)
        if m.get("result",{}).get("events"):
            t_holder.append(time.monotonic()); r.close(); return
synced, unsynced = [], []
for i in range(40):
    # synced: watch from the next revision, then the put happens 50 ms later
    k=f"s{i}"; start=rev()+1; t=[]; th=threading.Thread(target=watch_first_event,args=(k,start,t)); th.start(); time.sleep(0.05)
    t0=time.monotonic(); put(k); th.join(); synced.append(t[0]-t0)
    # unsynced: like the protocol — remember rev, make another write, watch from rev+1, then the put
    k=f"u{i}"; seen=rev(); put(f"other{i}"); t=[]; th=threading.Thread(target=watch_first_event,args=(k,seen+1,t)); th.start(); time.sleep(0.005)
    t0=time.monotonic(); put(k); th.join(); unsynced.append(t[0]-t0)
print("event delivered after the put — synced watch (from current+1): median %.1f ms, max %.1f ms" % (statistics.median(synced)*1e3, max(synced)*1e3))
print("event delivered after the put — watch from a past revision (seen+1 after another write): median %.1f ms, max %.1f ms" % (statistics.median(unsynced)*1e3, max(unsynced)*1e3))
e.terminate(); e.wait()
