#!/bin/sh
# node.sh: set up one node of an mpi_sgd cluster: sshd, the ssh client, the cluster's keys and
# its hostfile. The Docker cluster (docker/compose.yml) and the one-machine cluster of network
# namespaces (make netns-cluster) both call this script, so the ssh setup the tests run is the
# one the containers run.
#
#   node.sh keys KEYS                   once per cluster: a fresh key pair and authorized_keys
#   node.sh sshd CONF PORT KEYS         this node's sshd config and host key, in CONF
#   node.sh client CONF PORT KEYS       ssh client config (CONF/config) and wrapper (CONF/ssh)
#   node.sh serve CONF                  run sshd in the foreground
#   node.sh wait-ssh CONF SECONDS HOST...   until every host answers ssh in batch mode
#   node.sh hostfile FILE SLOTS HOST...     a hydra hostfile, SLOTS ranks per host
#   node.sh worker | head | keygen | healthy   the roles of docker/compose.yml (see there)
#
# Keys are made when a cluster comes up and live only as long as it does: never in an image,
# never in the repository.
set -eu

die() { echo "node.sh: $*" >&2; exit 1; }

keys() {  # KEYS
    mkdir -p "$1"
    chmod 700 "$1"
    if [ ! -f "$1/id_ed25519" ]; then
        ssh-keygen -q -t ed25519 -N '' -C "mpi_sgd cluster key" -f "$1/id_ed25519"
        cp "$1/id_ed25519.pub" "$1/authorized_keys"
    fi
    chmod 600 "$1/id_ed25519" "$1/authorized_keys"
}

sshd_config() {  # CONF PORT KEYS
    mkdir -p "$1"
    chmod 700 "$1"
    [ -f "$1/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "mpi_sgd host key" -f "$1/ssh_host_ed25519_key"
    # Keys only: no passwords, no PAM (which a non-root sshd cannot use), nothing forwarded.
    # ClientAlive*: when the launcher's host dies, the session ends within ~15 s and with it the
    # ranks it started, instead of ranks waiting on a peer that is gone.
    cat > "$1/sshd_config" <<EOF
Port $2
HostKey $1/ssh_host_ed25519_key
PidFile none
AuthorizedKeysFile $3/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
X11Forwarding no
AllowTcpForwarding no
PrintMotd no
ClientAliveInterval 5
ClientAliveCountMax 3
LogLevel ERROR
EOF
}

client_config() {  # CONF PORT KEYS
    mkdir -p "$1"
    chmod 700 "$1"
    # BatchMode: fail instead of asking for a password nobody will type. ConnectTimeout: an
    # unreachable host fails in 5 s (ssh's default waits for TCP, minutes). ServerAlive*: a host
    # that dies mid-run ends the session, and with it the MPI job, within ~15 s. The host keys
    # are made at bring-up, so they are trusted on first use into this cluster's own known_hosts.
    cat > "$1/config" <<EOF
Host *
    Port $2
    IdentityFile $3/id_ed25519
    IdentitiesOnly yes
    BatchMode yes
    ConnectTimeout 5
    ConnectionAttempts 1
    ServerAliveInterval 5
    ServerAliveCountMax 3
    StrictHostKeyChecking accept-new
    UserKnownHostsFile $1/known_hosts
    LogLevel ERROR
EOF
    chmod 600 "$1/config"
    # The launcher hydra calls (HYDRA_LAUNCHER_EXEC or mpiexec -launcher-exec). ssh exits 255
    # when it cannot connect or loses the host (ServerAlive above); hydra would then go on
    # waiting for that host's ranks, so the wrapper ends the job (its parent), naming the host.
    cat > "$1/ssh" <<EOF
#!/bin/sh
# ssh with this cluster's config (written by node.sh)
host() { while [ \$# -gt 0 ]; do case \$1 in -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;; -*) shift ;; *) echo "\$1"; return ;; esac; done; }
ssh -F $1/config "\$@"
rc=\$?
if [ \$rc -eq 255 ] && [ "\$(cat /proc/\$PPID/comm 2>/dev/null)" = mpiexec ]; then
    echo "ssh to \$(host "\$@") failed or the host stopped answering: ending the MPI job" >&2
    kill -TERM \$PPID
fi
exit \$rc
EOF
    chmod 700 "$1/ssh"
}

serve() {  # CONF
    exec /usr/sbin/sshd -D -e -f "$1/sshd_config"
}

wait_ssh() {  # CONF SECONDS HOST...
    conf=$1 deadline=$(( $(date +%s) + $2 ))
    shift 2
    for host in "$@"; do
        until "$conf/ssh" "$host" true 2>/dev/null; do
            [ "$(date +%s)" -lt "$deadline" ] || die "ssh to $host did not answer in time"
            sleep 0.5
        done
    done
}

hostfile() {  # FILE SLOTS HOST...
    file=$1 slots=$2
    shift 2
    { echo "# written by node.sh at bring-up: host:ranks, one line per host (hydra format)"
      for host in "$@"; do echo "$host:$slots"; done; } > "$file.tmp"
    mv "$file.tmp" "$file"
}

# -- the roles of docker/compose.yml: everything under the non-root user's home ---------------
KEYS=${CLUSTER_KEYS:-/cluster/keys}
PORT=${CLUSTER_SSH_PORT:-2222}
CONF=${HOME:-/tmp}/.ssh

worker_addresses() {  # every worker container's address, from the service name in Docker's DNS
    getent ahostsv4 "${WORKER_SERVICE:-worker}" | awk '{print $1}' | sort -u
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    keys) keys "$@" ;;
    sshd) sshd_config "$@" ;;
    client) client_config "$@" ;;
    serve) serve "$@" ;;
    wait-ssh) wait_ssh "$@" ;;
    hostfile) hostfile "$@" ;;
    keygen) keys "$KEYS" ;;
    worker)
        [ -f "$KEYS/authorized_keys" ] || die "no cluster key in $KEYS: the keygen service must run first"
        sshd_config "$HOME/.sshd" "$PORT" "$KEYS"
        serve "$HOME/.sshd" ;;
    head)
        # Wait until every worker resolves and answers ssh, then write the hostfile the
        # healthcheck looks for: the head reports healthy only when mpiexec can start.
        want=${WORKERS:-2} deadline=$(( $(date +%s) + ${STARTUP_SECONDS:-120} ))
        client_config "$CONF" "$PORT" "$KEYS"
        until [ "$(worker_addresses | wc -l)" -ge "$want" ]; do
            [ "$(date +%s)" -lt "$deadline" ] || die "only $(worker_addresses | wc -l) of $want workers resolve"
            sleep 1
        done
        # shellcheck disable=SC2046  # one argument per address
        wait_ssh "$CONF" "${STARTUP_SECONDS:-120}" $(worker_addresses)
        # shellcheck disable=SC2046
        hostfile "$HOME/hostfile" "${SLOTS:-2}" $(worker_addresses)
        echo "node.sh: $want workers answer ssh; hostfile $HOME/hostfile"
        exec sleep infinity ;;
    healthy)  # docker healthcheck: a worker's sshd answers, or the head's hostfile is written
        case "${1:-}" in
            worker) ssh-keyscan -T 2 -p "$PORT" 127.0.0.1 >/dev/null 2>&1 ;;
            head) [ -s "$HOME/hostfile" ] ;;
            *) die "healthy worker|head" ;;
        esac ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
