# Shared by the server's end-to-end scripts (check_serve.sh, check_serve_page.sh,
# check_serve_tools.sh); sourced. The caller sets W (its work folder), PID (the server it started
# with --port-file "$W/port") and fail().
# wait_port: waits up to 60 s for the server to write its port; sets PORT. Fails if the server
# exits first or never listens.
wait_port() {
  for _ in $(seq 600); do
    [ -s "$W/port" ] && break
    kill -0 "$PID" 2>/dev/null || fail "the server exited at start"
    sleep 0.1
  done
  [ -s "$W/port" ] || fail "the server did not listen within 60 s"
  PORT=$(cat "$W/port")
}
