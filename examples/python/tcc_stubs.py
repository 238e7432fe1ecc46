"""The tcc.v1 stubs, generated from the repository's proto/ when first imported.

Nothing generated is checked in: grpcio-tools' protoc compiles ../../proto/tcc/v1/*.proto
(or $HOLDFAST_PROTO/tcc/v1/*.proto) into a temporary folder, which is put on sys.path, so the
stubs always match the proto they were made from.
"""

import importlib
import importlib.resources
import os
import pathlib
import sys
import tempfile

from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(
    os.environ.get("HOLDFAST_PROTO", pathlib.Path(__file__).resolve().parents[2] / "proto")
)


def _generate() -> pathlib.Path:
    out = pathlib.Path(tempfile.mkdtemp(prefix="holdfast-py-stubs-"))
    protos = sorted(str(p) for p in (PROTO_ROOT / "tcc" / "v1").glob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT}/tcc/v1 (set HOLDFAST_PROTO)")
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_ROOT}: {' '.join(args)}")
    return out


sys.path.insert(0, str(_generate()))


def _load(name: str):
    return importlib.import_module(f"tcc.v1.{name}")


coordinator_pb2 = _load("coordinator_pb2")
coordinator_pb2_grpc = _load("coordinator_pb2_grpc")
common_pb2 = _load("common_pb2")
events_pb2 = _load("events_pb2")
events_pb2_grpc = _load("events_pb2_grpc")
payments_pb2 = _load("payments_pb2")
payments_pb2_grpc = _load("payments_pb2_grpc")
resource_admin_pb2 = _load("resource_admin_pb2")
resource_admin_pb2_grpc = _load("resource_admin_pb2_grpc")
testing_pb2 = _load("testing_pb2")
testing_pb2_grpc = _load("testing_pb2_grpc")
