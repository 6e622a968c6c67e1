"""A third-party client: Ollama's official `ollama` package pulling and
deleting models through `revis serve`'s /api, unchanged but for its host and
the key header.

Usage: python3 ollama_pull.py BASE_URL API_KEY MODEL_IN_USE OTHER_MODEL
Prints one JSON object with what it saw; exits non-zero on any failure.
"""
import json
import sys

import ollama


def main() -> None:
    base, key, in_use, other = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    out = {}
    for name in (other, in_use):
        parts = list(client.pull(name, stream=True))
        downloading = [p for p in parts if p.total]
        out[name] = {
            "statuses": [p.status for p in parts if not p.total],
            "progress_lines": len(downloading),
            "last_progress": [downloading[-1].completed, downloading[-1].total] if downloading else None,
            "monotonic": all(a.completed <= b.completed for a, b in zip(downloading, downloading[1:])),
        }
    # Already there: nothing is downloaded again.
    out["again"] = client.pull(other, stream=False).status
    out["deleted"] = client.delete(other).status
    for name, key_ in ((other, "delete_again"), (in_use, "delete_in_use"), ("no-such-model", "pull_unknown")):
        try:
            if key_ == "pull_unknown":
                client.pull(name, stream=False)
            else:
                client.delete(name)
            out[key_] = None
        except ollama.ResponseError as e:
            out[key_] = {"status": e.status_code, "error": e.error}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
