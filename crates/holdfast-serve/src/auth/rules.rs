//! Which roles may call which method (SPEC 7.2), by gRPC path. Deny by default: a method not
//! listed here is for admins only.

use super::Role;

/// What a method asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Anyone, authenticated or not: health checks (load balancers and probes carry no key).
    Open,
    /// Any authenticated principal: server reflection (it describes the API, nothing more).
    Authenticated,
    /// An authenticated principal with one of these roles.
    Roles(&'static [Role]),
}

const CLIENTS: &[Role] = &[Role::Client, Role::Admin];
const ADMINS: &[Role] = &[Role::Admin];
const COORDINATORS: &[Role] = &[Role::Coordinator, Role::Admin];
const SCRAPERS: &[Role] = &[Role::Metrics, Role::Admin];
/// Reading a resource's stock levels: a client, and the coordinator for its console's
/// inventory view.
const STOCK_READERS: &[Role] = &[Role::Client, Role::Coordinator, Role::Admin];

/// The path a request for the Prometheus text asks the auth layer about (`GET /metrics` on
/// the HTTP port and on `--metrics-listen`): no gRPC method, a rule of its own.
pub const METRICS_PATH: &str = "/metrics";

/// The rule of the method at `path` (`/package.Service/Method`).
pub fn of(path: &str) -> Rule {
    if path == METRICS_PATH {
        return Rule::Roles(SCRAPERS);
    }
    let (service, method) = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .unwrap_or(("", ""));
    match (service, method) {
        ("grpc.health.v1.Health", _) => Rule::Open,
        ("grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection", _) => {
            Rule::Authenticated
        }
        ("tcc.v1.Coordinator", _) => Rule::Roles(CLIENTS),
        // A client reads the events of its own reservations (the handler scopes them).
        ("tcc.v1.Events", _) => Rule::Roles(CLIENTS),
        // The operator's control plane (SPEC 8.1): admins only, said rather than defaulted.
        ("tcc.v1.Admin", _) => Rule::Roles(ADMINS),
        // Test mode's clock (SPEC 9): moving it expires everyone's holds.
        ("tcc.v1.Testing", _) => Rule::Roles(ADMINS),
        ("tcc.v1.Participant", _) => Rule::Roles(COORDINATORS),
        ("tcc.v1.Payments", "Charge") => Rule::Roles(CLIENTS),
        ("tcc.v1.Payments", "Refund" | "GetPayment") => Rule::Roles(COORDINATORS),
        ("tcc.v1.ResourceAdmin", "GetResource") => Rule::Roles(STOCK_READERS),
        _ => Rule::Roles(ADMINS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_reaches_exactly_its_methods() {
        let allowed = |path: &str, role: Role| match of(path) {
            Rule::Open | Rule::Authenticated => true,
            Rule::Roles(roles) => roles.contains(&role),
        };
        use Role::*;
        let table: &[(&str, &[Role])] = &[
            ("/tcc.v1.Coordinator/Reserve", &[Client, Admin]),
            ("/tcc.v1.Coordinator/ListReservations", &[Client, Admin]),
            ("/tcc.v1.Participant/Try", &[Coordinator, Admin]),
            ("/tcc.v1.Payments/Charge", &[Client, Admin]),
            ("/tcc.v1.Payments/Refund", &[Coordinator, Admin]),
            ("/tcc.v1.Payments/GetPayment", &[Coordinator, Admin]),
            (
                "/tcc.v1.ResourceAdmin/GetResource",
                &[Client, Coordinator, Admin],
            ),
            ("/tcc.v1.ResourceAdmin/PutResources", &[Admin]),
            ("/tcc.v1.Admin/ListStuck", &[Admin]),
            ("/tcc.v1.Admin/Retry", &[Admin]),
            ("/tcc.v1.Admin/ForceCancel", &[Admin]),
            ("/tcc.v1.Admin/Resolve", &[Admin]),
            ("/tcc.v1.Admin/ListAudit", &[Admin]),
            ("/tcc.v1.Admin/ResumeWebhook", &[Admin]),
            ("/tcc.v1.Admin/CountReservations", &[Admin]),
            ("/tcc.v1.Admin/GetInventory", &[Admin]),
            ("/tcc.v1.Events/Subscribe", &[Client, Admin]),
            ("/tcc.v1.Events/GetLatestSequence", &[Client, Admin]),
            ("/tcc.v1.Admin/ForceCancel", &[Admin]),
            ("/tcc.v1.Testing/AdvanceClock", &[Admin]),
            ("/tcc.v1.Testing/ExpireNow", &[Admin]),
            ("/tcc.v1.Unknown/Anything", &[Admin]),
            ("/metrics", &[Metrics, Admin]),
            ("garbage", &[Admin]),
        ];
        for (path, roles) in table {
            for role in Role::ALL {
                assert_eq!(
                    allowed(path, role),
                    roles.contains(&role),
                    "{path} {role:?}"
                );
            }
        }
        assert_eq!(of("/grpc.health.v1.Health/Check"), Rule::Open);
        assert_eq!(
            of("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            Rule::Authenticated
        );
    }
}
