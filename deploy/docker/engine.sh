# Sourced by deploy/docker/test-compose.sh: a Docker engine and a compose tool for the run.
#   docker_tools      installs Debian's docker.io, docker-compose and debootstrap when missing (root + apt-get)
#   engine_start      starts dockerd when none answers; ENGINE_STARTED=1 then
#   engine_stop       stops the dockerd engine_start started (nothing else)
#   compose_tool      `docker compose` (v2) when the plugin answers, else `docker-compose` (1.29)

docker_tools() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  [ ${#missing[@]} = 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test-compose: needs ${missing[*]} (install them, or run as root where apt-get works)" >&2
    return 1
  fi
  echo "test-compose: apt-get install ${missing[*]}"
  local log=/var/log/kvmesh-apt.log
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >"$log" 2>&1 \
    || { tail -20 "$log" >&2; echo "test-compose: apt-get install ${missing[*]} failed" >&2; return 1; }
}

ENGINE_STARTED=0
engine_start() {
  docker info >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || { echo "test-compose: no Docker engine answers, and starting one needs root" >&2; return 1; }
  echo "test-compose: starting dockerd"
  dockerd >/var/log/kvmesh-dockerd.log 2>&1 &
  ENGINE_PID=$!
  ENGINE_STARTED=1
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return 0
    kill -0 "$ENGINE_PID" 2>/dev/null || break
    sleep 1
  done
  echo "test-compose: dockerd did not come up; its log:" >&2
  tail -20 /var/log/kvmesh-dockerd.log >&2
  return 1
}

engine_stop() {
  [ "$ENGINE_STARTED" = 1 ] || return 0
  echo "test-compose: stopping the dockerd it started"
  kill -TERM "$ENGINE_PID" 2>/dev/null || return 0
  for _ in $(seq 30); do kill -0 "$ENGINE_PID" 2>/dev/null || return 0; sleep 1; done
  kill -KILL "$ENGINE_PID" 2>/dev/null || true
}

compose_tool() {
  if docker compose version >/dev/null 2>&1; then echo "docker compose"; else echo "docker-compose"; fi
}
