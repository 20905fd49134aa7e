# Sourced by hack/conformance.sh and hack/conformance/client.sh: one spearlet under test.

# start_spearlet WORK: `$SPEARLET serve` over WORK/registry (profile `conformance`) on three free
# loopback ports from the kernel (a busy CI machine runs other servers), logging to
# WORK/spearlet.log; sets SPEARLET_PID, HTTP_PORT, GRPC_PORT and ADMIN_PORT.
start_spearlet() {
  local work=$1
  read -r HTTP_PORT GRPC_PORT ADMIN_PORT < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
  "$SPEARLET" serve --registry-dir "$work/registry" --profile conformance \
    --http-addr "127.0.0.1:$HTTP_PORT" --grpc-addr "127.0.0.1:$GRPC_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
    >"$work/spearlet.log" 2>&1 &
  SPEARLET_PID=$!
}

# wait_ready SECONDS: 0 once /readyz answers 200; 1 when spearlet exited or the time ran out.
wait_ready() {
  local _
  for _ in $(seq 1 $(($1 * 4))); do
    curl -sf "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null && return 0
    kill -0 "$SPEARLET_PID" 2>/dev/null || return 1
    sleep 0.25
  done
  return 1
}

# write_profile FILE SERVER: appends the McpProfile `conformance` over SERVER, its default server.
write_profile() {
  cat >>"$1" <<YAML
---
apiVersion: mcp.spear.dev/v1alpha1
kind: McpProfile
metadata:
  name: conformance
spec:
  servers: [$2]
  defaultServers: [$2]
YAML
}
