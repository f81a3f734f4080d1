#!/bin/sh
# One NVIDIA MPS control daemon per card of this node, in the layout the gpushare device
# plugin mounts into GPU containers (gpushare_hub/plugin/response.py):
#   <root>/<card UUID>/pipe  the daemon's CUDA_MPS_PIPE_DIRECTORY (clients' too)
#   <root>/<card UUID>/shm   the daemon's /dev/shm (mounted over the clients' /dev/shm)
#   <root>/<card UUID>/log   CUDA_MPS_LOG_DIRECTORY
# Environment: MPS_ROOT (the host folder, mounted at the same path), MPS_MULTI_USER (true:
# -M, one root server for every UID; Volta or newer), MPS_SHM_SIZE (a tmpfs of this size on
# each card's shm; empty: a plain folder, in RAM when the root is under the host's /run),
# MPS_CHECK_INTERVAL (seconds between health checks), MPS_READY_FILE (written once all run),
# MPS_DEFAULT_PINNED_MEM_LIMIT (e.g. 7G; empty: none): each daemon's default per-process limit,
# a ceiling no client can raise its own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT above (measured on an
# H100: a client asking 8G under a 4G default got 4G); set it to the largest slice offered.
# MPS_DEFAULT_ACTIVE_THREAD_PERCENTAGE (1 to 100; empty: that largest slice's share of each
# card, its memory's percentage rounded up, as the plugin's Allocate computes a share): each
# daemon's default share of its card's SMs, a ceiling no client can raise its own
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE above (measured on an H200: a client asking 100 under a
# default of 25 got 25), so no notebook takes more of a card than the largest slice's share.
# nvidia-smi and nvidia-cuda-mps-control come from the host driver (NVIDIA runtime).
set -eu
root=${MPS_ROOT:?MPS_ROOT is not set}
flags=-d
if [ "${MPS_MULTI_USER:-false}" = true ]; then flags="-d -M"; fi
ready=${MPS_READY_FILE:-/tmp/mps-ready}
cards=$(nvidia-smi --query-gpu=uuid --format=csv,noheader)
if [ -z "$cards" ]; then
    echo "no NVIDIA card on this node" >&2
    exit 1
fi

mib_of() { # SIZE like 7G or 7168M: MiB
    case $1 in
        *G) echo $(( ${1%G} * 1024 )) ;;
        *M) echo "${1%M}" ;;
        *) echo "size $1 is neither <n>G nor <n>M" >&2; exit 1 ;;
    esac
}

share_of() { # UUID: the compute ceiling of this card's daemon, in percent (empty: none)
    if [ -n "${MPS_DEFAULT_ACTIVE_THREAD_PERCENTAGE:-}" ]; then
        echo "$MPS_DEFAULT_ACTIVE_THREAD_PERCENTAGE"
        return
    fi
    [ -n "${MPS_DEFAULT_PINNED_MEM_LIMIT:-}" ] || return 0
    slice=$(mib_of "$MPS_DEFAULT_PINNED_MEM_LIMIT")
    total=$(nvidia-smi -i "$1" --query-gpu=memory.total --format=csv,noheader,nounits | tr -d ' ')
    case $total in
        ''|*[!0-9]*|0) echo "nvidia-smi gave no memory size for $1: '$total'" >&2; exit 1 ;;
    esac
    share=$(( (100 * slice + total - 1) / total ))
    [ "$share" -le 100 ] || share=100
    echo "$share"
}

control() { # UUID COMMAND: one command on the card's control pipe
    echo "$2" | CUDA_MPS_PIPE_DIRECTORY="$root/$1/pipe" nvidia-cuda-mps-control
}

stop() { # EXIT-STATUS: quit every daemon (its server goes with it), cards back to DEFAULT
    rm -f "$ready"
    for uuid in $cards; do
        control "$uuid" quit || true
        nvidia-smi -i "$uuid" -c DEFAULT >/dev/null || true
    done
    exit "$1"
}
trap 'stop 0' TERM INT

for uuid in $cards; do
    dir=$root/$uuid
    mkdir -p "$dir/pipe" "$dir/log" "$dir/shm"
    # The server runs as its client's UID (not multi-user): it must reach pipe, log and shm.
    chmod 0755 "$root" "$dir" "$dir/pipe" "$dir/log"
    chmod 1777 "$dir/shm"
    if [ -n "${MPS_SHM_SIZE:-}" ] && ! mountpoint -q "$dir/shm"; then
        mount -t tmpfs -o "rw,nosuid,nodev,noexec,mode=1777,size=$MPS_SHM_SIZE" tmpfs "$dir/shm"
    fi
    # Only MPS clients on this card (NVIDIA's daemon does the same).
    nvidia-smi -i "$uuid" -c EXCLUSIVE_PROCESS >/dev/null
    # A mount namespace of its own with the card's shm at /dev/shm; the daemon (-d forks)
    # keeps it after unshare returns.
    unshare --mount sh -c 'd=$1 u=$2 && shift 2 && mount --bind "$d/shm" /dev/shm &&
        exec env CUDA_VISIBLE_DEVICES="$u" CUDA_MPS_PIPE_DIRECTORY="$d/pipe" \
            CUDA_MPS_LOG_DIRECTORY="$d/log" nvidia-cuda-mps-control "$@"' \
        sh "$dir" "$uuid" $flags
    # Before any client: a server takes the defaults in force when it starts.
    if [ -n "${MPS_DEFAULT_PINNED_MEM_LIMIT:-}" ]; then
        control "$uuid" "set_default_device_pinned_mem_limit 0 $MPS_DEFAULT_PINNED_MEM_LIMIT"
    fi
    share=$(share_of "$uuid")
    if [ -n "$share" ]; then
        control "$uuid" "set_default_active_thread_percentage $share"
    fi
    echo "MPS control daemon for $uuid: $dir ($flags; ceilings: memory ${MPS_DEFAULT_PINNED_MEM_LIMIT:-none}, compute ${share:-100}%)"
done
touch "$ready"

while :; do
    sleep "${MPS_CHECK_INTERVAL:-30}" &
    wait $! || true
    for uuid in $cards; do
        if ! control "$uuid" get_default_active_thread_percentage >/dev/null; then
            echo "MPS control daemon for $uuid does not answer" >&2
            stop 1
        fi
    done
done
