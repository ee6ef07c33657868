#!/usr/bin/env bash
# Runs idemcheck against Idempotency-Key implementations installed from the
# Go module proxy and the npm registry, each serving the same orders
# endpoint on a loopback port, and writes the compatibility table.
#
#   compat/run.sh                 # the table on standard output
#   compat/run.sh -readme         # and into idemtest/README.md
#
# Needs Go, Node.js 20 or later with npm, and access to both registries.
# Everything is built and installed in a work directory ($WORK, a fresh
# temporary one by default), never in the repository. Each server is
# stopped once its runs are done. BASE_PORT (default 18300) is the first of
# the loopback ports used.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# Each Go server is built in its own module, whatever workspace the
# repository has.
export GOWORK=off
work=${WORK:-$(mktemp -d)}
base_port=${BASE_PORT:-18300}
readme=
if [[ ${1:-} == -readme ]]; then
	readme=$root/idemtest/README.md
fi
mkdir -p "$work/bin" "$work/node" "$work/results"
results=$work/results
: >"$results/runs.txt"

log() { printf '%s\n' "$*" >&2; }

log "building idemcheck and the Go servers in $work"
(cd "$root" && go build -o "$work/bin/idemcheck" ./cmd/idemcheck)
for server in fiber2 fiber3; do
	(cd "$here/$server" && go build -o "$work/bin/$server" .)
done
(cd "$here" && go build -o "$work/bin/ours" ./ours && go build -o "$work/bin/table" ./table)

log "installing the Node servers' packages"
cp "$here/node/package.json" "$here/node/package-lock.json" "$here/node/"*.js "$work/node/"
(cd "$work/node" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)

gomod() { (cd "$here/$1" && go list -m -f '{{.Version}}' "$2"); }
npmver() { (cd "$work/node" && node -p "require('$1/package.json').version"); }

pid=
stop() {
	if [[ -n $pid ]]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		pid=
	fi
}
trap stop EXIT

# start PORT ENV... -- COMMAND...: starts a server and waits until its port
# takes connections, for 30 seconds at most.
start() {
	local port=$1
	shift
	local env=()
	while [[ $1 != -- ]]; do
		env+=("$1")
		shift
	done
	shift
	env PORT="$port" NODE_ENV=production "${env[@]}" "$@" >>"$work/servers.log" 2>&1 &
	pid=$!
	for _ in $(seq 300); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			log "the server on port $port exited; see $work/servers.log"
			return 1
		fi
		sleep 0.1
	done
	log "the server on port $port did not listen within 30s"
	return 1
}

# check NAME SUFFIX PORT FLAGS...: runs idemcheck against the orders endpoint
# and keeps its JSON report. A failed check is not an error here.
check() {
	local name=$1 suffix=$2 port=$3
	shift 3
	"$work/bin/idemcheck" -json \
		-H 'Authorization: Bearer alice' -H2 'Authorization: Bearer bob' \
		-fail-header 'X-Fail: 1' -d '{"sku":"A1","note":"{{variant}}"}' \
		-patience 3s "$@" "http://127.0.0.1:$port/orders" >"$results/$name$suffix.json" || true
}

# implementation NAME VERSION FRAMEWORK FAIL FLAGS QUOTED -- COMMAND...: the
# runs of one implementation: all checks; key-forms with both key forms
# declared, when QUOTED is "claims-quoted" (the implementation documents
# quoted keys; the others never claim them, so the check would judge a
# promise they did not make); concurrent against a handler without delay;
# and 5xx-not-cached against a handler that answers 500 itself rather than
# through the framework's error path.
n=0
implementation() {
	local name=$1 version=$2 framework=$3 fail=$4 flags=$5 quoted=$6
	shift 7
	local port=$((base_port + n))
	n=$((n + 1))
	local file
	file=$(printf '%s' "$name" | tr -c 'a-zA-Z0-9' '-' | sed 's/^-*//; s/-*$//')
	log "checking $name $version"
	# shellcheck disable=SC2086 # the flags are words
	{
		start "$port" -- "$@" && check "$file" "" "$port" $flags && stop
		if [[ $quoted == claims-quoted ]]; then
			start "$port" -- "$@" && check "$file" .keyforms "$port" $flags -key-form both \
				-checks key-forms && stop
		fi
		start "$port" DELAY_MS=0 -- "$@" && check "$file" .fast "$port" $flags \
			-checks concurrent && stop
		start "$port" FAIL_MODE=respond -- "$@" && check "$file" .respond "$port" $flags \
			-checks 5xx-not-cached && stop
	}
	printf '{"name":"%s","version":"%s","framework":"%s","flags":"%s","fail":"%s"}\n' \
		"$name" "$version" "$framework" "$flags" "$fail" >"$results/$file.meta.json"
	echo "$file" >>"$results/runs.txt"
}

# The flags declare what each implementation documents: its key header, the
# lengths of key it takes, whether keys are optional.
implementation "this module's server" "(this checkout)" "net/http, memory store" \
	"http.Error(w, …, 500)" "-key-form both -max-key-len 255 -require-5xx-release" claims-quoted \
	-- "$work/bin/ours"
implementation "express-idempotency" "$(npmver express-idempotency)" "express $(npmver express)" \
	"next(err) to Express's error handler, after reportError(req)" "-keys-optional" - \
	-- node "$work/node/express.js"
implementation "@node-idempotency/nestjs" "$(npmver @node-idempotency/nestjs)" \
	"NestJS $(npmver @nestjs/core), @node-idempotency/core $(npmver @node-idempotency/core), memory storage" \
	"a thrown InternalServerErrorException" "-keys-optional -max-key-len 256" - \
	-- node "$work/node/nestjs.js"
implementation "gofiber/fiber/v2 middleware/idempotency" "$(gomod fiber2 github.com/gofiber/fiber/v2)" \
	"fasthttp $(gomod fiber2 github.com/valyala/fasthttp)" "fiber.NewError(500, …) returned" \
	"-keys-optional -key-header X-Idempotency-Key -min-key-len 36 -max-key-len 36" - \
	-- "$work/bin/fiber2"
implementation "gofiber/fiber/v3 middleware/idempotency" "$(gomod fiber3 github.com/gofiber/fiber/v3)" \
	"fasthttp $(gomod fiber3 github.com/valyala/fasthttp)" "fiber.NewError(500, …) returned" \
	"-keys-optional -key-header X-Idempotency-Key -min-key-len 36 -max-key-len 36" - \
	-- "$work/bin/fiber3"

header="Observed on $(date -u +%Y-%m-%d) with $(go env GOVERSION) and Node.js $(node --version), by \`compat/run.sh\`."
if [[ -n $readme ]]; then
	"$work/bin/table" -header "$header" -readme "$readme" "$results"
	log "wrote the table into $readme"
fi
"$work/bin/table" -header "$header" "$results"
log "reports in $results"
