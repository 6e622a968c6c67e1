"""A third-party client: Google's grpcio, generated from proto/ at run time,
calls Status and Generate on revisd over its Unix socket.

Usage: python3 grpcio_client.py SOCKET PROTO_ROOT
Prints one JSON line with what it asked and saw; exits non-zero on any failure.
"""
import json
import sys
import tempfile

import grpc
from grpc_tools import protoc


# Greedy: the test asks revisd the same through its own client and compares.
QUESTION = "What is the capital of France?"
MAX_TOKENS = 32


def main() -> None:
    socket, proto_root = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp(prefix="revis-grpcio-")
    rc = protoc.main(["protoc", f"-I{proto_root}", f"--python_out={out}", f"--grpc_python_out={out}", "revis/v1/revis.proto"])
    if rc != 0:
        sys.exit(f"protoc failed: {rc}")
    sys.path.insert(0, out)
    from revis.v1 import revis_pb2 as pb, revis_pb2_grpc as rpc

    # No channel options: grpcio sends the socket path as :authority, which
    # revisd accepts (crates/revis-daemon/src/authority.rs).
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        status = rpc.AdminStub(channel).Status(pb.StatusRequest(), timeout=30)
        req = pb.GenerateRequest(
            messages=[pb.ChatMessage(role=pb.ROLE_USER, content=QUESTION.encode())],
            sampling=pb.Sampling(temperature=0.0),
            max_tokens=MAX_TOKENS,
        )
        deltas, done = [], None
        for event in rpc.InferenceStub(channel).Generate(req, timeout=60):
            kind = event.WhichOneof("event")
            if kind == "delta":
                deltas.append(event.delta.text)
            elif kind == "done":
                done = event.done
    print(json.dumps({
        "question": QUESTION,
        "max_tokens": MAX_TOKENS,
        "version": status.version,
        "tiers": [t.tier for t in status.tiers],
        "streamed": "".join(deltas),
        "text": done.text if done else None,
        "finish_reason": pb.FinishReason.Name(done.finish_reason) if done else None,
        "prompt_tokens": done.prompt_tokens if done else None,
        "generated_tokens": done.generated_tokens if done else None,
    }))


if __name__ == "__main__":
    main()
