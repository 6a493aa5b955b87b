#!/usr/bin/env bash
# Run the Eddy JDBC (pgjdbc) test suite against a running Eddy server.
# Usage: clients/jdbc/run.sh JDBC_URL
#   e.g. clients/jdbc/run.sh jdbc:postgresql://127.0.0.1:5433/eddy
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 JDBC_URL" >&2
  exit 2
fi

dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec mvn -q -B -f "$dir/pom.xml" test -Deddy.url="$1"
