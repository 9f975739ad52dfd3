"""A sender on a lab host (tests/test_multihost.py): sends ``count`` messages round-robin to the
given receivers through its own host's API, each with its own idempotency key, retrying a send
until the store has it (a 503 "nothing written", a host restarting, a database away: the same
request again, so it is stored once). Each stored send is written to ``out`` as one JSON line
(marker, receiver, message id); the receivers' own records are the proof of delivery."""

from __future__ import annotations

import argparse
import json
import time

import httpx


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--name", required=True)  # the sender id, and the markers' prefix
    p.add_argument("--receivers", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--give-up-after", type=float, default=240.0)
    args = p.parse_args()
    receivers = args.receivers.split(",")
    deadline = time.monotonic() + args.give_up_after
    headers = {"Authorization": f"Bearer {args.token}"}
    retries = 0
    with (
        httpx.Client(base_url=args.url, headers=headers, trust_env=False, timeout=15) as client,
        open(args.out, "a") as out,
    ):
        for i in range(args.count):
            rid = receivers[i % len(receivers)]
            marker = f"{args.name}-{i:05d}"
            delay = 0.05
            while True:
                try:
                    r = client.post(
                        f"/terminals/{rid}/inbox/messages",
                        json={
                            "message": f"{marker} hello",
                            "sender_id": args.name,
                            "idempotency_key": marker,
                        },
                    )
                    if r.status_code in (200, 201):
                        out.write(
                            json.dumps({"marker": marker, "receiver": rid, "id": r.json()["message_id"]})
                            + "\n"
                        )
                        out.flush()
                        break
                    if r.status_code < 500:
                        raise SystemExit(f"{marker}: refused {r.status_code}: {r.text[:300]}")
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{marker}: not stored before the deadline")
                retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    with open(args.out + ".retries", "w") as f:  # how often the world said "not now"
        f.write(str(retries))


if __name__ == "__main__":
    main()
