#!/usr/bin/env bash
# Make podman usable for `make test-image` on a fresh CI machine (Debian, root). Safe to run again.
#
# - installs podman, runc and debootstrap with apt-get when any is missing;
# - selects runc and the cgroupfs manager: crun fails on these kernels' hybrid cgroup layout;
# - sets default_ulimits = [] because setting rlimits inside the sandbox is refused here;
# - logs events to a file (there is no journald/systemd in the CI sandbox).
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "error: $0 must run as root (it installs packages and writes /etc/containers)" >&2
    exit 1
fi

missing=()
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq podman runc debootstrap >/dev/null
fi

conf=/etc/containers/containers.conf.d/50-semif-ci.conf
want='# written by semif-adapter .ci/setup-podman.sh
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
    mkdir -p "$(dirname "$conf")"
    printf '%s\n' "$want" >"$conf"
    echo "wrote $conf"
fi

podman info --format 'podman {{.Version.Version}}: runtime {{.Host.OCIRuntime.Name}}, cgroups {{.Host.CgroupManager}}'
