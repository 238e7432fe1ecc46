// The tcc.v1 clients, made at run time from the repository's proto/ by @grpc/proto-loader:
// nothing generated is checked in, so the clients always match the proto (HOLDFAST_PROTO
// names another proto root). Field names as in the proto (keepCase), enums as their names
// ("HELD"), int64 as numbers.

import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as protobuf from "protobufjs";

const PROTO_ROOT = process.env.HOLDFAST_PROTO ?? path.resolve(__dirname, "..", "..", "..", "proto");
const FILES = ["coordinator", "events", "payments", "resource_admin", "testing"].map(
  (name) => `tcc/v1/${name}.proto`,
);

const definition = protoLoader.loadSync(FILES, {
  includeDirs: [PROTO_ROOT],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});

type ServiceClient = grpc.ServiceClientConstructor;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const tcc = (grpc.loadPackageDefinition(definition) as any).tcc.v1 as Record<string, ServiceClient>;

/** A client of `service` (Coordinator, Events, Testing, Payments, ResourceAdmin) at `address`. */
export function client(service: string, address: string): grpc.Client {
  const constructor = tcc[service];
  if (!constructor) {
    throw new Error(`no service tcc.v1.${service} in ${PROTO_ROOT}`);
  }
  return new constructor(address, grpc.credentials.createInsecure());
}

/** Calls unary method `method` of `client` with `request`, within `timeoutMs`. */
export function call<Res>(client: grpc.Client, method: string, request: object, timeoutMs = 10_000): Promise<Res> {
  const deadline = new Date(Date.now() + timeoutMs);
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const fn = (client as any)[method] as Function | undefined;
  if (!fn) {
    return Promise.reject(new Error(`no method ${method}`));
  }
  return new Promise((resolve, reject) => {
    fn.call(client, request, { deadline }, (error: grpc.ServiceError | null, answer: Res) =>
      error ? reject(error) : resolve(answer),
    );
  });
}

// google.rpc.Status and ErrorInfo: only the fields a refusal's reason needs.
const rpc = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: "int32", id: 1 },
                message: { type: "string", id: 2 },
                details: { rule: "repeated", type: "Any", id: 3 },
              },
            },
            Any: { fields: { type_url: { type: "string", id: 1 }, value: { type: "bytes", id: 2 } } },
            ErrorInfo: {
              fields: {
                reason: { type: "string", id: 1 },
                domain: { type: "string", id: 2 },
                metadata: { keyType: "string", type: "string", id: 3 } as protobuf.IMapField,
              },
            },
          },
        },
      },
    },
  },
});

/** The reason of a refusal (`HOLD_EXPIRED`, `INSUFFICIENT_CAPACITY`, ...): the
 * google.rpc.ErrorInfo (domain tcc.v1) in the status details; "" if there is none. */
export function reasonOf(error: grpc.ServiceError): string {
  const [bytes] = error.metadata?.get("grpc-status-details-bin") ?? [];
  if (!(bytes instanceof Buffer)) {
    return "";
  }
  const status = rpc.lookupType("google.rpc.Status").decode(bytes) as unknown as {
    details: { type_url: string; value: Uint8Array }[];
  };
  for (const detail of status.details) {
    if (detail.type_url.endsWith("/google.rpc.ErrorInfo")) {
      const info = rpc.lookupType("google.rpc.ErrorInfo").decode(detail.value) as unknown as {
        reason: string;
        domain: string;
      };
      if (info.domain === "tcc.v1") {
        return info.reason;
      }
    }
  }
  return "";
}
