#!/usr/bin/env bash
# Makes the credentials of a holdfast deployment in OUT_DIR, once (an existing set is kept):
#
#   coordinator-principals.toml   --auth-keys of the coordinators: order-service (client), ops (admin),
#                                 prometheus (metrics)
#   participant-principals.toml   --auth-keys of the participants: coordinator (coordinator), ops (admin),
#                                 prometheus (metrics)
#   coordinator.key               --participant-api-key-file of the coordinators
#   order-service.key, ops.key    the callers' API keys (hand them out; delete them here after)
#   prometheus.key                the scraper's key for /metrics (Prometheus: authorization.credentials_file)
#   token-secret.toml             --token-secret-file of the coordinators (all replicas share it)
#
# The principals files hold only SHA-256 digests of the keys. Every file is owner-only (0600).
# Usage: deploy/auth/make-keys.sh OUT_DIR   (HOLDFAST=path/to/holdfast if not on PATH)
set -euo pipefail
out=${1:?usage: make-keys.sh OUT_DIR}
holdfast=${HOLDFAST:-holdfast}
umask 077
mkdir -p "$out"
if [ -e "$out/coordinator-principals.toml" ]; then
  echo "make-keys: $out already has credentials; nothing changed"
  exit 0
fi
# A principal: its key goes to NAME.key, its [[principal]] entry to NAME.entry.
principal() {
  local text
  text=$("$holdfast" keys new "$1" --role "$2")
  printf '%s\n' "$text" | sed -n '2s/^# //p' > "$out/$1.key"
  printf '%s\n' "$text" | grep -v '^#' > "$out/$1.entry"
}
principal order-service client
principal ops admin
principal coordinator coordinator
principal prometheus metrics
"$holdfast" keys token-secret --id k1 > "$out/token-secret.toml"
cat "$out/coordinator.entry" "$out/ops.entry" "$out/prometheus.entry" > "$out/participant-principals.toml"
# Written last: its presence means the set is complete.
cat "$out/order-service.entry" "$out/ops.entry" "$out/prometheus.entry" > "$out/coordinator-principals.toml.partial"
mv "$out/coordinator-principals.toml.partial" "$out/coordinator-principals.toml"
rm -f "$out"/*.entry
echo "make-keys: credentials written to $out"
