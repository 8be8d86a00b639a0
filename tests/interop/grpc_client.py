#!/usr/bin/env python3
"""gRPC C-core (Python grpcio) client for tests/integration/csi/interop.rs.

Usage: grpc_client.py default|socket-path CSI_SOCKET REGISTRATION_SOCKET

Calls drivelet's two gRPC sockets with raw request bytes (no generated stubs) over
`grpc.insecure_channel("unix://" + path)`:

- default: no channel options, so C-core picks its own default :authority;
- socket-path: the option ("grpc.default_authority", path), so the :authority is the
  socket path, exactly what grpc-java (DomainSocketAddress) and kubelet's grpc-go
  plugin registration client send.

Prints one JSON object: {"grpcio": version, "mode": mode, "calls": [{"socket",
"method", "authority", "code", "details", "response_hex"}]}; the Rust test decodes the
responses and judges them. Exit 3 when grpc cannot be imported, 2 on bad usage.
"""

import json
import sys

try:
    import grpc
except ImportError as e:  # the Rust test turns this into a failure naming setup-host.sh
    print(f"cannot import grpc (Python package grpcio): {e}; run scripts/setup-host.sh", file=sys.stderr)
    sys.exit(3)

# (socket key, full method name, request bytes). An empty message is a valid request
# for every call but DeleteVolume, which must answer INVALID_ARGUMENT (no volume id):
# errors must still arrive as gRPC statuses, not as stream resets.
CALLS = [
    ("csi", "/csi.v1.Identity/GetPluginInfo", b""),
    ("csi", "/csi.v1.Identity/Probe", b""),
    ("csi", "/csi.v1.Node/NodeGetInfo", b""),
    ("csi", "/csi.v1.Controller/DeleteVolume", b""),
    ("registration", "/pluginregistration.Registration/GetInfo", b""),
    # kubelet's second call: RegistrationStatus{plugin_registered: true}.
    ("registration", "/pluginregistration.Registration/NotifyRegistrationStatus", b"\x08\x01"),
]


def call(path, method, request, mode):
    options = [] if mode == "default" else [("grpc.default_authority", path)]
    with grpc.insecure_channel("unix://" + path, options=options) as channel:
        # No (de)serializers: bytes in, bytes out.
        rpc = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            response = rpc(request, timeout=10)
            return {"code": "OK", "details": "", "response_hex": response.hex()}
        except grpc.RpcError as e:
            return {"code": e.code().name, "details": e.details() or "", "response_hex": ""}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("default", "socket-path"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    mode, sockets = sys.argv[1], {"csi": sys.argv[2], "registration": sys.argv[3]}
    calls = []
    for key, method, request in CALLS:
        path = sockets[key]
        result = call(path, method, request, mode)
        result.update(socket=key, method=method, authority="(C-core default)" if mode == "default" else path)
        calls.append(result)
    print(json.dumps({"grpcio": grpc.__version__, "mode": mode, "calls": calls}))


if __name__ == "__main__":
    main()
