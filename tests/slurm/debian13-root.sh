#!/usr/bin/env bash
# Build (once) and print the path of a Debian 13 (trixie) root that holds Slurm 24.11 and a
# Python 3.13 venv with hpctf's dependencies and the newest TensorFlow: the second Slurm of the
# test command (tests/slurm/cluster.sh with HPCTF_SLURM_ROOT=<this path>).
#
#   tests/slurm/debian13-root.sh          # the root's path on stdout (built first if missing)
#   tests/slurm/debian13-root.sh --path   # the path it has or would have; builds nothing
#
# Cached under ${HPCTF_SLURM2411_CACHE:-~/.cache/hpctf-slurm2411}/<recipe hash>/: the hash is
# of the recipe below (suite, packages, pip requirements), so a change to it builds a new root
# beside the old one and nothing else does. Built in a temporary folder beside it and renamed
# when complete (a killed build leaves no half root under the final name), under a lock (two
# pytest-xdist workers wait for one build). Needs root, debootstrap (tests/system-packages.sh)
# and the network (Debian's mirror, the Python package index). Measured: 97 s on this machine
# kind (debootstrap 67 s, pip 30 s), about 8 minutes on a loaded one; the root takes 2.2 GB.
#
# hpctf itself is not installed in the root: the cluster binds the checkout into it and the
# venv finds it on the path the jobs are given (so a change to the code needs no rebuild).
set -euo pipefail

# ---------------------------------------------------------------- the recipe (hashed)
SUITE=trixie
MIRROR=${HPCTF_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# slurm-wlm: slurmctld, slurmd, the clients; slurmdbd for sacct (its MariaDB is the host's).
PACKAGES=slurm-wlm,slurmdbd,munge,python3,python3-venv,procps,iproute2,ca-certificates
VENV=/opt/hpctf-venv
# hpctf's dependencies (pyproject.toml), its tf extra at the newest TensorFlow with cp313 wheels,
# and what the examples and the search need on the workers.
PIP_REQUIREMENTS=(
    "click>=8.1" "jinja2>=3.1" "pydantic>=2.6" "python-hostlist>=1.23" "PyYAML>=6.0"
    "tensorflow-cpu==2.21.0" "tensorboard>=2.16" "scikit-learn>=1.3" "optuna>=4.0"
)
RECIPE_FORMAT=1
# ---------------------------------------------------------------- end of the recipe

ME=tests/slurm/debian13-root.sh
log() { echo "$ME: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

CACHE=${HPCTF_SLURM2411_CACHE:-$HOME/.cache/hpctf-slurm2411}
KEY=$(printf '%s\n' "$RECIPE_FORMAT" "$SUITE" "$PACKAGES" "$VENV" "${PIP_REQUIREMENTS[@]}" |
    sha256sum | cut -c1-12)
ROOT=$CACHE/$KEY

if [[ ${1:-} == --path ]]; then
    echo "$ROOT"
    exit 0
fi
[[ $# -eq 0 ]] || {
    echo "usage: $0 [--path]" >&2
    exit 2
}

complete() { [[ -f $ROOT/.hpctf-root-complete && -x $ROOT$VENV/bin/python ]]; }

if complete; then
    echo "$ROOT"
    exit 0
fi

[[ $(id -u) -eq 0 ]] || die "building the Slurm 24.11 root needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || die "debootstrap is not installed: run tests/system-packages.sh"
mkdir -p "$CACHE"
exec 9>"$ROOT.lock"
flock 9
if complete; then # another process built it while this one waited
    echo "$ROOT"
    exit 0
fi

# A build that failed after debootstrap (pip: the network) goes on from there next time.
TMP=$ROOT.tmp
MOUNTS=()
cleanup() {
    local i
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        umount --lazy "${MOUNTS[i]}" 2>/dev/null || true
    done
}
trap cleanup EXIT

start=$SECONDS
if [[ ! -f $TMP/.hpctf-debootstrap-done ]]; then
    rm -rf --one-file-system "$TMP"
    log "building the Slurm 24.11 root (Debian $SUITE, about 8 minutes) in $TMP"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$TMP" "$MIRROR" \
        >"$CACHE/$KEY.debootstrap.log" 2>&1 ||
        die "debootstrap failed (see $CACHE/$KEY.debootstrap.log)"
    date +%s >"$TMP/.hpctf-debootstrap-done"
    log "debootstrap done after $((SECONDS - start)) s; making the venv"
fi

# pip inside the root: the network's names and the kernel's file systems.
cp -L /etc/resolv.conf "$TMP/etc/resolv.conf"
for m in proc sys dev; do
    mount --bind "/$m" "$TMP/$m"
    MOUNTS+=("$TMP/$m")
done
# The host's certificate authorities: where a proxy inspects TLS, its own is only there (pip
# on Python 3.13 trusts the system's store, not PIP_CERT alone).
if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
    cp -L /etc/ssl/certs/ca-certificates.crt "$TMP/etc/ssl/certs/ca-certificates.crt"
fi
[[ -x $TMP$VENV/bin/python ]] || chroot "$TMP" /usr/bin/python3 -m venv "$VENV"
# The host's pip settings (find-links, indexes, constraints) name host paths: none of them.
chroot "$TMP" env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT \
    PIP_CONFIG_FILE=/dev/null PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PIP_REQUIREMENTS[@]}" \
    >"$CACHE/$KEY.pip.log" 2>&1 || die "pip in the root failed (see $CACHE/$KEY.pip.log)"
for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount "${MOUNTS[i]}"; done
MOUNTS=()

# The services the packages started nothing (no init in a chroot), but their config folders
# belong to the host's users by number: the cluster runs everything as root inside.
{
    echo "built $(date -u +%FT%TZ) in $((SECONDS - start)) s"
    # shellcheck disable=SC2016  # dpkg-query's own fields
    chroot "$TMP" dpkg-query -W -f='${Package} ${Version}\n' slurmctld python3
    chroot "$TMP" "$VENV/bin/python" -c \
        'import importlib.metadata as m, sys; print("python", sys.version.split()[0]); print("tensorflow-cpu", m.version("tensorflow-cpu"))'
} >"$TMP/.hpctf-root-complete"
rm -f "$TMP/.hpctf-debootstrap-done"
mv -T "$TMP" "$ROOT"
log "built in $((SECONDS - start)) s: $ROOT"
cat "$ROOT/.hpctf-root-complete" >&2
echo "$ROOT"
