#!/usr/bin/env bash
# Builds a base image for the Dockerfile from Debian's packages, for where no container registry
# answers: debootstrap (minbase) from the mirror apt already uses, `docker import`, then python3
# and its venv module on top. Needs root, debootstrap and a running Docker engine.
#
#   deploy/docker/debian-base.sh IMAGE [SUITE [MIRROR]]     # e.g. kvmesh-base:bookworm
set -euo pipefail
image=${1:?usage: debian-base.sh IMAGE [SUITE [MIRROR]]}
suite=${2:-bookworm}

# The first apt source (one-line or deb822) that serves SUITE's main component.
apt_mirror() {
  python3 - "$1" <<'PY'
import glob, sys
suite, found = sys.argv[1], []
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*"))]:
    try:
        text = open(path).read()
    except OSError:
        continue
    if path.endswith(".sources"):
        for block in text.split("\n\n"):
            fields = dict(l.split(":", 1) for l in block.splitlines() if ":" in l and not l.startswith((" ", "#")))
            if suite in fields.get("Suites", "").split() and "main" in fields.get("Components", "").split():
                found += fields.get("URIs", "").split()
    else:
        for line in text.splitlines():
            words = [w for w in line.split() if not w.startswith("[")]
            if words[:1] == ["deb"] and len(words) > 3 and words[2] == suite and "main" in words[3:]:
                found.append(words[1])
print(found[0] if found else "http://deb.debian.org/debian")
PY
}
mirror=${3:-$(apt_mirror "$suite")}

root=$(mktemp -d /var/tmp/kvmesh-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap $suite from $mirror"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
# Slim like debian:*-slim: no package caches, and dpkg leaves out docs, man pages and locales.
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
  'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
  > "$root/etc/dpkg/dpkg.cfg.d/slim"
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/*
find "$root/usr/share/doc" -type f ! -name copyright -delete
tar -C "$root" -c . | docker import - "$image-rootfs" >/dev/null
printf '%s\n' "FROM $image-rootfs" \
  'RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \' \
  '    && apt-get clean && rm -rf /var/lib/apt/lists/*' \
  'CMD ["python3"]' | docker build -q -t "$image" - >/dev/null 2>&1
docker rmi "$image-rootfs" >/dev/null
echo "built $image ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
