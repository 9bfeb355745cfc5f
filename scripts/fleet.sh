#!/usr/bin/env bash
# A fleet of `mzcache serve` on one machine (docs/fleet.md): Debian's redis-server (AOF on) as the
# remote tier, N servers on loopback ports each with --remote, and nginx in front of them routing by
# the X-Mz-Conversation header (consistent hash: a conversation's turns go to one server), retrying
# on another server when one is down (connection refused, 502/503/504). Loopback only.
#
# Usage:
#   scripts/fleet.sh start DIR    starts everything; DIR holds the state (ports, pids, logs, pools)
#   scripts/fleet.sh stop DIR     stops what start started (by the pids it wrote)
#   scripts/fleet.sh status DIR   each process and its /health
#   scripts/fleet.sh redis-stop DIR / redis-start DIR   Redis down and back (tests: degraded mode)
# Environment (start):
#   MZ_CLI           the mzcache binary (default: build/mzcache beside this script's repository)
#   MZ_MODEL         the GGUF to serve (default: the CLI's default model)
#   MZ_FLEET_SERVERS servers (default 3)
#   MZ_FLEET_PORT    the load balancer's port (default 8090; 0: a free one). DIR/lb.port has it.
#   MZ_FLEET_SERVE_ARGS  more arguments for every server (e.g. "--persist-codec none -c 4096")
#   MZ_FLEET_REMOTE  1 (default): every server has --remote on the fleet's Redis; 0: no remote tier
#                    (Redis still runs, unused: the baseline bench/fleet_bench.sh compares with)
#   MZ_FLEET_TLS     1: the servers reach Redis over TLS (rediss://, its TLS port in DIR/redis-tls.port)
#                    with a self-signed certificate for 127.0.0.1 made by `openssl req` in DIR/tls/
#                    (--remote-ca-file); the plain port stays for redis-cli. 0 (default): plain TCP.
# Files in DIR: lb.port, redis.port, server-I.port / .pid / .log (I = 1..N), redis.pid, nginx.pid,
# nginx.conf, pool-I/ (each server's --pool-dir), redis/ (its AOF).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CMD=${1:-}
DIR=${2:-}
case "$CMD" in -h|--help) sed -n '2,24p' "$0"; exit 0 ;; esac
[ -n "$CMD" ] && [ -n "$DIR" ] || { sed -n '2,24p' "$0" >&2; exit 2; }
log() { echo "[fleet] $*" >&2; }
die() { echo "[fleet] error: $*" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_all() {
  for f in "$DIR"/nginx.pid "$DIR"/server-*.pid "$DIR"/redis.pid; do
    [ -f "$f" ] || continue
    if alive "$f"; then
      kill "$(cat "$f")" 2>/dev/null || true
      for _ in $(seq 50); do alive "$f" || break; sleep 0.1; done
      alive "$f" && kill -9 "$(cat "$f")" 2>/dev/null || true
    fi
    rm -f "$f"
  done
}

# Redis on DIR/redis.port with its AOF in DIR/redis (a restart finds what it held).
start_redis() {
  local port tls=()
  port=$(cat "$DIR/redis.port")
  [ -s "$DIR/redis-tls.port" ] && tls=(--tls-port "$(cat "$DIR/redis-tls.port")" --tls-cert-file "$DIR/tls/cert.pem"
    --tls-key-file "$DIR/tls/key.pem" --tls-ca-cert-file "$DIR/tls/cert.pem" --tls-auth-clients optional)
  redis-server --port "$port" "${tls[@]}" --bind 127.0.0.1 --dir "$DIR/redis" --appendonly yes --appendfsync everysec \
    --save "" --maxmemory "${MZ_FLEET_REDIS_MAXMEMORY:-1gb}" --maxmemory-policy allkeys-lru \
    --logfile "$DIR/redis/redis.log" --daemonize no >/dev/null 2>&1 &
  echo $! >"$DIR/redis.pid"
  for _ in $(seq 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0
    alive "$DIR/redis.pid" || die "redis-server exited at start: $(tail -5 "$DIR/redis/redis.log")"
    sleep 0.1
  done
  die "redis-server did not answer within 10 s"
}

case "$CMD" in
start)
  CLI=${MZ_CLI:-$HERE/../build/mzcache}
  N=${MZ_FLEET_SERVERS:-3}
  [ -x "$CLI" ] || die "no mzcache binary at $CLI (build it, or set MZ_CLI)"
  command -v redis-server >/dev/null || die "redis-server is not installed (scripts/deps.sh installs it)"
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
  [ -x "$NGINX" ] || die "nginx is not installed (scripts/deps.sh installs it)"
  mkdir -p "$DIR/redis" "$DIR/nginx-tmp"
  DIR=$(cd "$DIR" && pwd)
  stop_all
  # Redis: loopback, AOF on (fsync every second), no RDB snapshots; bounded, LRU (the tier verifies
  # what it reads and computes again what Redis evicted).
  free_port >"$DIR/redis.port"
  rm -f "$DIR/redis-tls.port"
  if [ "${MZ_FLEET_TLS:-0}" = 1 ]; then
    "$HERE/loopback-cert.sh" "$DIR/tls" || die "MZ_FLEET_TLS=1: no certificate for Redis"
    free_port >"$DIR/redis-tls.port"
  fi
  start_redis
  RPORT=$(cat "$DIR/redis.port")
  log "redis on 127.0.0.1:$RPORT (AOF in $DIR/redis)"
  # The servers.
  MODEL_ARGS=()
  [ -n "${MZ_MODEL:-}" ] && MODEL_ARGS=(-m "$MZ_MODEL")
  # shellcheck disable=SC2206
  EXTRA=(${MZ_FLEET_SERVE_ARGS:-})
  REMOTE_ARGS=(--remote "redis://127.0.0.1:$RPORT")
  if [ -s "$DIR/redis-tls.port" ]; then
    REMOTE_ARGS=(--remote "rediss://127.0.0.1:$(cat "$DIR/redis-tls.port")" --remote-ca-file "$DIR/tls/cert.pem")
    log "the servers reach redis over TLS on 127.0.0.1:$(cat "$DIR/redis-tls.port")"
  fi
  [ "${MZ_FLEET_REMOTE:-1}" = 0 ] && REMOTE_ARGS=()
  for i in $(seq "$N"); do
    rm -f "$DIR/server-$i.port"
    "$CLI" serve "${MODEL_ARGS[@]}" --port 0 --port-file "$DIR/server-$i.port" --pool-dir "$DIR/pool-$i" \
      "${REMOTE_ARGS[@]}" --no-watch-pressure "${EXTRA[@]}" >>"$DIR/server-$i.log" 2>&1 &
    echo $! >"$DIR/server-$i.pid"
  done
  for i in $(seq "$N"); do
    for _ in $(seq 600); do
      [ -s "$DIR/server-$i.port" ] && break
      alive "$DIR/server-$i.pid" || die "server $i exited at start: $(tail -5 "$DIR/server-$i.log")"
      sleep 0.1
    done
    [ -s "$DIR/server-$i.port" ] || die "server $i did not listen within 60 s"
  done
  # nginx: affinity by X-Mz-Conversation (a request without one goes anywhere), streaming unbuffered,
  # a POST retried on the next server when one is down (non_idempotent: a turn that failed before
  # its first byte is safe to send again: the server computes nothing twice that it answered).
  LPORT=${MZ_FLEET_PORT:-8090}
  [ "$LPORT" = 0 ] && LPORT=$(free_port)
  {
    [ "$(id -u)" = 0 ] && echo "user root;"
    echo "worker_processes 1;"
    echo "pid $DIR/nginx.pid;"
    echo "error_log $DIR/nginx-error.log warn;"
    echo "events { worker_connections 256; }"
    echo "http {"
    echo "  access_log $DIR/nginx-access.log;"
    echo "  client_body_temp_path $DIR/nginx-tmp/body; proxy_temp_path $DIR/nginx-tmp/proxy;"
    echo "  fastcgi_temp_path $DIR/nginx-tmp/fcgi; uwsgi_temp_path $DIR/nginx-tmp/uwsgi; scgi_temp_path $DIR/nginx-tmp/scgi;"
    echo "  map \$http_x_mz_conversation \$mz_affinity { \"\" \$request_id; default \$http_x_mz_conversation; }"
    echo "  upstream mzcache {"
    echo "    hash \$mz_affinity consistent;"
    for i in $(seq "$N"); do echo "    server 127.0.0.1:$(cat "$DIR/server-$i.port") max_fails=1 fail_timeout=10s;"; done
    echo "  }"
    echo "  server {"
    echo "    listen 127.0.0.1:$LPORT;"
    echo "    client_max_body_size 8m;"
    echo "    location / {"
    echo "      proxy_pass http://mzcache;"
    echo "      proxy_http_version 1.1;"
    echo "      proxy_set_header Connection \"\";"
    echo "      proxy_buffering off;"
    echo "      proxy_read_timeout 600s;"
    echo "      proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;"
    echo "      proxy_next_upstream_tries 3;"
    echo "      add_header X-Mz-Upstream \$upstream_addr always;"
    echo "    }"
    echo "  }"
    echo "}"
  } >"$DIR/nginx.conf"
  "$NGINX" -t -q -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/nginx-error.log" || die "nginx refused $DIR/nginx.conf"
  "$NGINX" -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/nginx-error.log" -g 'daemon off;' >/dev/null 2>&1 &
  for _ in $(seq 100); do
    [ -s "$DIR/nginx.pid" ] && curl -s -o /dev/null "http://127.0.0.1:$LPORT/health" && break
    sleep 0.1
  done
  curl -s -o /dev/null "http://127.0.0.1:$LPORT/health" || die "nginx did not answer on $LPORT: $(tail -5 "$DIR/nginx-error.log")"
  echo "$LPORT" >"$DIR/lb.port"
  log "$N servers behind nginx on http://127.0.0.1:$LPORT (affinity: X-Mz-Conversation)"
  ;;
redis-stop)  # Redis down (SIGTERM: it writes its AOF), the servers go on degraded
  [ -f "$DIR/redis.pid" ] && kill "$(cat "$DIR/redis.pid")" 2>/dev/null || true
  for _ in $(seq 100); do alive "$DIR/redis.pid" || break; sleep 0.1; done
  rm -f "$DIR/redis.pid"
  log "redis stopped"
  ;;
redis-start)  # Redis back on its port with its AOF
  DIR=$(cd "$DIR" && pwd)
  alive "$DIR/redis.pid" || start_redis
  log "redis on 127.0.0.1:$(cat "$DIR/redis.port")"
  ;;
stop)
  stop_all
  log "stopped"
  ;;
status)
  for f in "$DIR"/redis.pid "$DIR"/nginx.pid "$DIR"/server-*.pid; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .pid)
    if alive "$f"; then state=running; else state=down; fi
    health=
    if [[ $name == server-* ]] && [ -f "$DIR/$name.port" ]; then
      health=$(curl -s --max-time 2 "http://127.0.0.1:$(cat "$DIR/$name.port")/health" || true)
    fi
    echo "$name: $state $health"
  done
  ;;
*) die "unknown command '$CMD' (start, stop, status, redis-stop, redis-start)" ;;
esac
