#!/bin/sh
# check-banned.sh — fails when C sources use calls ddpd bans (STYLE.md): sprintf, strcpy,
# strcat, gets, atoi, atol, system, popen (no shell anywhere: processes start with
# execve and an argv). Like curl's checksrc, but only this one rule.
set -eu
cd "$(dirname "$0")/.."
hits=$(grep -nE '(^|[^_a-z])(sprintf|vsprintf|strcpy|strcat|gets|atoi|atol|system|popen)[[:space:]]*\(' \
    base/*.c schema/*.c tokenizer/*.c worker/*.c worker/*/*.c server/*.c examples/*.c 2>/dev/null | grep -vE 'snprintf|vsnprintf' || true)
if [ -n "$hits" ]; then
    echo "banned calls (use snprintf, strtol, execve):"
    echo "$hits"
    exit 1
fi
echo "no banned calls"
