#!/usr/bin/env bash
# Starts or stops a throwaway local PostgreSQL for the bench module's
# postgres rows: Debian's package, a fresh cluster in a temporary directory,
# listening only on 127.0.0.1, trust authentication, fsync and
# synchronous_commit on (the server's defaults, as a durable baseline needs).
#
#   scripts/postgres.sh start    # installs postgresql if missing, starts it,
#                                # prints the line to export
#   scripts/postgres.sh stop     # stops it and removes its directory
#   scripts/postgres.sh status
#
#   eval "$(scripts/postgres.sh start)"; go run ./compare; scripts/postgres.sh stop
#
# Environment: IDEM_BENCH_PG_PORT (default 54329), TMPDIR. The cluster lives
# in $TMPDIR/idem-bench-pg-$PORT. As root, the server runs as the postgres
# user (which the package creates); otherwise as the current user.
set -euo pipefail

port="${IDEM_BENCH_PG_PORT:-54329}"
dir="${TMPDIR:-/tmp}/idem-bench-pg-${port}"
data="$dir/data"
dsn="postgres://postgres@127.0.0.1:${port}/postgres?sslmode=disable"

log() { printf 'postgres.sh: %s\n' "$*" >&2; }

bindir() {
	local d
	d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
	if [[ -z "$d" || ! -x "$d/pg_ctl" ]]; then
		return 1
	fi
	printf '%s\n' "$d"
}

install() {
	if bindir >/dev/null; then
		return
	fi
	if [[ $(id -u) -ne 0 ]]; then
		log "PostgreSQL is not installed; run as root, or: sudo apt-get install -y postgresql"
		exit 1
	fi
	log "installing Debian's postgresql package"
	# The package's own cluster is not started: policy-rc.d refuses in
	# containers, and we start ours below either way.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 ||
		{ apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2; }
}

# as runs its arguments as the cluster's owner.
as() {
	if [[ $(id -u) -eq 0 ]]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

running() {
	local bin
	bin="$(bindir)" || return 1
	[[ -f "$data/postmaster.pid" ]] && as "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1
}

start() {
	install
	local bin
	bin="$(bindir)"
	if running; then
		log "already running in $dir"
		printf "export IDEM_BENCH_PG='%s'\n" "$dsn"
		return
	fi
	rm -rf "$dir"
	mkdir -p "$dir"
	if [[ $(id -u) -eq 0 ]]; then
		chown postgres:postgres "$dir"
	fi
	as "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; exit 1; }
	# Sockets in the cluster's own directory: /var/run/postgresql may not exist.
	as "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 30 start -o "\
		-c listen_addresses=127.0.0.1 -p $port -k $dir \
		-c fsync=on -c synchronous_commit=on -c full_page_writes=on \
		-c max_connections=300 -c shared_buffers=256MB" >&2 ||
		{ cat "$dir/server.log" >&2; exit 1; }
	log "running in $dir, port $port; stop with: $0 stop"
	printf "export IDEM_BENCH_PG='%s'\n" "$dsn"
}

stop() {
	local bin
	if bin="$(bindir)" && [[ -f "$data/postmaster.pid" ]]; then
		as "$bin/pg_ctl" -D "$data" -m fast -w stop >&2 || true
	fi
	rm -rf "$dir"
	log "stopped; removed $dir"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
	if running; then
		printf "running in %s\nexport IDEM_BENCH_PG='%s'\n" "$dir" "$dsn"
	else
		echo "not running"
		exit 1
	fi
	;;
*)
	echo "usage: $0 start|stop|status" >&2
	exit 2
	;;
esac
