# Sourced by the Dockerfile's build stage before each `pip install` (POSIX sh).
# Empty build args are unset, so pip keeps its defaults (an empty PIP_INDEX_URL would be an index);
# deploy/pip/ca.crt becomes pip's CA bundle and deploy/pip/wheels/ a find-links folder when present.
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_FIND_LINKS TORCH_INDEX_URL; do
  eval "value=\${$name:-}"
  if [ -z "$value" ]; then unset "$name"; else export "$name"; fi
done
if [ -s /tmp/pip/ca.crt ]; then
  export PIP_CERT=/tmp/pip/ca.crt
fi
if ls /tmp/pip/wheels/*.whl >/dev/null 2>&1; then
  export PIP_FIND_LINKS="/tmp/pip/wheels${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"
fi
# images.sh staged every wheel the image needs (deploy/pip/wheels/COMPLETE): no index at all.
if [ -f /tmp/pip/wheels/COMPLETE ]; then
  export PIP_NO_INDEX=1
fi
