#!/usr/bin/env bash
# A device call may run 10 minutes; a job may run longer. Start it in its own session (it then
# outlives the call, while the machine is held), and wait for it, bounded, in later calls.
#   bash scripts/device/bg.sh start NAME CMD [ARG...]    log: /tmp/pdbench-jobs/NAME.log
#   bash scripts/device/bg.sh wait NAME MAX_S            exit: the job's status, 124 if still running
set -euo pipefail
dir=/tmp/pdbench-jobs
mkdir -p "$dir"
case ${1:-} in
  start)
    name=${2:?name}; shift 2
    rm -f "$dir/$name.rc"
    setsid nohup bash -c '"$@"; echo $? >"'"$dir/$name.rc"'"' bash "$@" >"$dir/$name.log" 2>&1 </dev/null &
    echo "bg: started $name (pid $!)" ;;
  wait)
    name=${2:?name}; max=${3:?max seconds}
    end=$((SECONDS + max))
    while [ ! -f "$dir/$name.rc" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    tail -n 25 "$dir/$name.log"
    if [ -f "$dir/$name.rc" ]; then echo "bg: $name exited $(cat "$dir/$name.rc")"; exit "$(cat "$dir/$name.rc")"; fi
    echo "bg: $name still running after ${max} s"; exit 124 ;;
  *) echo "usage: bg.sh start NAME CMD... | wait NAME MAX_S" >&2; exit 2 ;;
esac
