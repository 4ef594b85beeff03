#!/bin/sh
# Entry point of the simulated-node containers (compose/docker-compose.yml, x-node).
# The nodes sit only on the internal `backend` network, which must give them no way out. Docker
# engines before 25.0 (Debian 12's docker.io is 20.10) still hand such a container a default route
# via the bridge (moby/moby#46603 stopped that in 25.0); the engine's iptables rules drop what it
# would carry, but the route should not be there at all. So, started as root with only CAP_NET_ADMIN,
# CAP_SETUID and CAP_SETGID, this script deletes any default route, then drops to uid/gid 10001 with no
# capabilities (no-new-privileges is set on the container, so none can be regained) and runs gpuobs.
set -eu
if [ "$(id -u)" = 0 ]; then
  for family in -4 -6; do
    if [ -n "$(ip "$family" route show default)" ]; then
      ip "$family" route del default
    fi
  done
  exec setpriv --reuid=10001 --regid=10001 --clear-groups --inh-caps=-all gpuobs "$@"
fi
exec gpuobs "$@"
