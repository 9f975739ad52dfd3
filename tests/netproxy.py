"""Runs inside a lab host's network namespace (tests/netlab.py): one JSON request a line on stdin,
one JSON answer a line on stdout (``status`` 0: no answer). The bearer token is its argument."""

from __future__ import annotations

import json
import sys

import httpx


def main() -> None:
    token = sys.argv[1]
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, trust_env=False) as client:
        for line in sys.stdin:
            req = json.loads(line)
            try:
                r = client.request(
                    req["method"], req["url"], json=req.get("json"), timeout=req.get("timeout", 30)
                )
                try:
                    body = r.json()
                except ValueError:
                    body = r.text
                out = {"status": r.status_code, "body": body}
            except httpx.HTTPError as exc:
                out = {"status": 0, "body": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
