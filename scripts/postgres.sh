#!/usr/bin/env bash
# Starts or stops a throwaway local PostgreSQL, and optionally a PgBouncer in
# front of it, for the tests (idempg) and the benchmarks (bench): Debian's
# packages, a fresh cluster in a temporary directory, listening only on
# 127.0.0.1, trust authentication, fsync and synchronous_commit on (the
# server's defaults, as a durable baseline needs).
#
#   scripts/postgres.sh start               # starts PostgreSQL, prints the line to export
#   scripts/postgres.sh start --pgbouncer   # and a PgBouncer in transaction pooling mode
#   scripts/postgres.sh stop                # stops both and removes their directory
#   scripts/postgres.sh status
#
#   eval "$(scripts/postgres.sh start --pgbouncer)" && go test -race ./idempg/...
#
# It prints, for eval:
#
#   export IDEM_TEST_PG='postgres://…:54329/postgres?sslmode=disable'
#   export IDEM_TEST_PGBOUNCER='postgres://…:54330/postgres?sslmode=disable'   (with --pgbouncer)
#
# IDEM_TEST_PG is the one variable that names the server for the tests and the
# benchmarks alike; IDEM_TEST_PGBOUNCER is the same server through PgBouncer,
# where idempg's tests run the conformance suite once more in poll-only mode.
#
# Environment: IDEM_TEST_PG_PORT (default 54329), IDEM_TEST_PGBOUNCER_PORT
# (default the PostgreSQL port + 1), TMPDIR. Both live in
# $TMPDIR/idem-test-pg-$PORT. As root, the servers run as the postgres user
# (which the package creates; neither runs as root); otherwise as the current
# user. The script downloads nothing: install the packages first
# (apt-get install postgresql pgbouncer; .ci/run does).
#
# The server preloads pg_stat_statements (Debian's postgresql ships it), for
# profiles of the statements the tests and benchmarks send:
#   psql "$IDEM_TEST_PG" -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements'
#   psql "$IDEM_TEST_PG" -c 'SELECT calls, mean_exec_time, query FROM pg_stat_statements ORDER BY total_exec_time DESC'
# A server already running without it is restarted in place (same data
# directory, same port: its clients see their connections end once).
set -euo pipefail

port="${IDEM_TEST_PG_PORT:-54329}"
bport="${IDEM_TEST_PGBOUNCER_PORT:-$((port + 1))}"
dir="${TMPDIR:-/tmp}/idem-test-pg-${port}"
data="$dir/data"
dsn="postgres://postgres@127.0.0.1:${port}/postgres?sslmode=disable"
bdsn="postgres://postgres@127.0.0.1:${bport}/postgres?sslmode=disable"

log() { printf 'postgres.sh: %s\n' "$*" >&2; }

bindir() {
	local d
	d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
	if [[ -z "$d" || ! -x "$d/pg_ctl" ]]; then
		return 1
	fi
	printf '%s\n' "$d"
}

pgbouncer_bin() {
	command -v pgbouncer 2>/dev/null || { [[ -x /usr/sbin/pgbouncer ]] && echo /usr/sbin/pgbouncer; }
}

# as runs its arguments as the servers' owner.
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

bouncer_running() {
	[[ -f "$dir/pgbouncer.pid" ]] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null
}

# options are the server's settings, on pg_ctl's command line.
options() {
	printf '%s' "-c listen_addresses=127.0.0.1 -p $port -k $dir \
		-c fsync=on -c synchronous_commit=on -c full_page_writes=on \
		-c max_connections=300 -c shared_buffers=256MB \
		-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
}

# preloaded reports whether the running server has pg_stat_statements loaded.
preloaded() {
	as "$1/psql" -h "$dir" -p "$port" -U postgres -d postgres -Atqc 'SHOW shared_preload_libraries' 2>/dev/null |
		grep -q pg_stat_statements
}

start_postgres() {
	local bin
	bin="$(bindir)" || { log "PostgreSQL is not installed: apt-get install -y postgresql"; exit 1; }
	if running; then
		if preloaded "$bin"; then
			log "PostgreSQL already running in $dir"
			return
		fi
		log "PostgreSQL running in $dir without pg_stat_statements: restarting it in place"
		as "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 -m fast restart -o "$(options)" >&2 ||
			{ cat "$dir/server.log" >&2; exit 1; }
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
	as "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 30 start -o "$(options)" >&2 ||
		{ cat "$dir/server.log" >&2; exit 1; }
	log "PostgreSQL running in $dir, port $port; stop with: $0 stop"
}

# start_pgbouncer starts PgBouncer in transaction pooling mode: a server
# connection is a client's only for the length of a transaction, so session
# state (prepared statements, LISTEN, SET) does not survive between them.
start_pgbouncer() {
	local bin
	bin="$(pgbouncer_bin)" || { log "PgBouncer is not installed: apt-get install -y pgbouncer"; exit 1; }
	if bouncer_running; then
		log "PgBouncer already running, port $bport"
		return
	fi
	cat >"$dir/pgbouncer.ini" <<-EOF
		[databases]
		postgres = host=127.0.0.1 port=$port dbname=postgres user=postgres

		[pgbouncer]
		listen_addr = 127.0.0.1
		listen_port = $bport
		unix_socket_dir = $dir
		auth_type = trust
		auth_file = $dir/userlist.txt
		pool_mode = transaction
		max_client_conn = 1000
		default_pool_size = 40
		logfile = $dir/pgbouncer.log
		pidfile = $dir/pgbouncer.pid
	EOF
	printf '"postgres" ""\n' >"$dir/userlist.txt"
	if [[ $(id -u) -eq 0 ]]; then
		chown postgres:postgres "$dir/pgbouncer.ini" "$dir/userlist.txt"
	fi
	as "$bin" -d "$dir/pgbouncer.ini" >&2 || { cat "$dir/pgbouncer.log" >&2 2>/dev/null; exit 1; }
	local i
	for i in $(seq 1 100); do
		bouncer_running && break
		sleep 0.1
	done
	bouncer_running || { log "PgBouncer did not start"; cat "$dir/pgbouncer.log" >&2 2>/dev/null; exit 1; }
	log "PgBouncer running, port $bport (transaction pooling)"
}

stop() {
	local bin
	if bouncer_running; then
		kill "$(cat "$dir/pgbouncer.pid")" || true
	fi
	if bin="$(bindir)" && [[ -f "$data/postmaster.pid" ]]; then
		as "$bin/pg_ctl" -D "$data" -m fast -w stop >&2 || true
	fi
	rm -rf "$dir"
	log "stopped; removed $dir"
}

case "${1:-}" in
start)
	start_postgres
	printf "export IDEM_TEST_PG='%s'\n" "$dsn"
	if [[ "${2:-}" == "--pgbouncer" ]]; then
		start_pgbouncer
		printf "export IDEM_TEST_PGBOUNCER='%s'\n" "$bdsn"
	fi
	;;
stop) stop ;;
status)
	if running; then
		printf "running in %s\nexport IDEM_TEST_PG='%s'\n" "$dir" "$dsn"
		if bouncer_running; then
			printf "export IDEM_TEST_PGBOUNCER='%s'\n" "$bdsn"
		fi
	else
		echo "not running"
		exit 1
	fi
	;;
*)
	echo "usage: $0 start [--pgbouncer] | stop | status" >&2
	exit 2
	;;
esac
