#!/usr/bin/env bash
# Run one command inside the Slurm 24.11 root (tests/slurm/debian13-root.sh), where the host's
# paths the tests share with it are where they are on the host:
#
#   tests/slurm/in-root.sh ROOT COMMAND [ARG...]
#
# In a private mount namespace of its own: /proc, /sys, /dev and /tmp (the cluster's state,
# munged's socket, pytest's tmp dirs, the run directories) bound at the same places, the
# checkout too, and the root's Python 3.13 venv bound over HPCTF_ROOT_VENV_AT (the venv of the
# Python that runs the tests: a rendered script's PYTHON, sys.executable of the submitting
# side, names the root's Python there). Its site-packages gets a .pth naming the checkout, so
# the workers import this checkout's hpctf. HPCTF_ROOT_HOSTS: a file bound at the root's
# /etc/hosts (an emulated node's; the host's by default). The environment and the working
# directory are kept; the exit status is the command's.
#
# Inside the root already (a job's batch script calls scontrol through the tests' wrappers),
# it runs the command as it is.
set -euo pipefail

if [[ -f /.hpctf-root-complete ]]; then
    shift
    exec "$@"
fi

ME=$(readlink -f "${BASH_SOURCE[0]}")
ROOT=$1
shift
REPO=$(cd "$(dirname "$ME")/../.." && pwd)

if [[ ${HPCTF_IN_ROOT_NS:-} != "$ROOT" ]]; then
    HPCTF_IN_ROOT_NS=$ROOT exec unshare --mount --propagation private -- "$ME" "$ROOT" "$@"
fi
unset HPCTF_IN_ROOT_NS

VENV_AT=${HPCTF_ROOT_VENV_AT:-$REPO/.venv}
SITE=$ROOT/opt/hpctf-venv/lib/python3.13/site-packages
# The .pth that names this checkout: a file beside the root per checkout, bound over an empty
# one in the root (two checkouts on one machine share the root, each with its own hpctf).
PTH=$ROOT.checkout-$(printf '%s' "$REPO" | sha256sum | cut -c1-12).pth
if [[ ! -f $PTH ]] || [[ $(<"$PTH") != "$REPO" ]]; then
    printf '%s\n' "$REPO" >"$PTH.$$"
    mv -f "$PTH.$$" "$PTH"
fi
[[ -e $SITE/hpctf-checkout.pth ]] || : >"$SITE/hpctf-checkout.pth"

for path in /proc /sys /dev /tmp; do
    mount --rbind "$path" "$ROOT$path"
done
mkdir -p "$ROOT$REPO"
mount --rbind "$REPO" "$ROOT$REPO"
mount --bind "$PTH" "$SITE/hpctf-checkout.pth"
if [[ -d $VENV_AT ]]; then
    mkdir -p "$ROOT$VENV_AT" 2>/dev/null || true
    mount --rbind "$ROOT/opt/hpctf-venv" "$ROOT$VENV_AT" # with the .pth bound in it
fi
mount --bind "${HPCTF_ROOT_HOSTS:-/etc/hosts}" "$ROOT/etc/hosts"

# chroot starts in /: back to the caller's folder (or / where the root has none).
# shellcheck disable=SC2016  # expanded by the inner sh
exec chroot "$ROOT" /bin/sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' in-root "$PWD" "$@"
