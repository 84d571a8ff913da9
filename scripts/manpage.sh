#!/usr/bin/env bash
# Writes moesim(1) in roff to stdout from the help texts of the built binary: `moesim --help`,
# then `moesim CMD --help` for every command and `moesim trace SUB --help` for every trace
# subcommand, so the man page never disagrees with the program.
# Usage: scripts/manpage.sh BUILD/moesim > moesim.1
set -euo pipefail
bin=$1

# roff-escapes help text: backslashes, and lines starting with '.' or "'" (roff requests)
esc() { sed -e 's/\\/\\e/g' -e "s/^\([.']\)/\\\\\&\1/"; }

# the command names of a `--help` command list ("  name   summary" after "commands:")
commands() { "$@" --help | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { on = 0 }'; }

version=$("$bin" --version)
cat <<HEAD
.TH MOESIM 1 "" "$version" "User Commands"
.SH NAME
moesim \- record MoE router traces, simulate expert offloading policies, replay them
.SH SYNOPSIS
.B moesim
.RI [ --data-dir " DIR" ]
.I command
.RI [ options ]
.SH DESCRIPTION
.nf
HEAD
"$bin" --help | esc
echo ".fi"
echo ".SH COMMANDS"
for cmd in $(commands "$bin"); do
    echo ".SS moesim $cmd"
    echo ".nf"
    "$bin" "$cmd" --help | esc
    echo ".fi"
    if [ "$cmd" = trace ]; then
        for sub in $(commands "$bin" trace); do
            echo ".SS moesim trace $sub"
            echo ".nf"
            "$bin" trace "$sub" --help | esc
            echo ".fi"
        done
    fi
done
cat <<'TAIL'
.SH FILES
Data (model and hardware configs, policy presets, plot scripts, experiments) is searched along
the data search path: every \fB--data-dir\fR, then \fBMOESIM_DATA_PATH\fR, then
\fI../share/moesim\fR beside the executable, then the source tree of an uninstalled build. Each
folder on it is laid out like \fIshare/moesim\fR: \fIconfigs/models\fR, \fIconfigs/hw\fR,
\fIconfigs/policies\fR, \fIconfigs/quant.ini\fR, \fIplots\fR, \fIexperiments\fR.
.SH ENVIRONMENT
.TP
.B MOESIM_DATA_PATH
colon-separated folders searched before the installed data.
.SH SEE ALSO
The READMEs in \fIshare/doc/moesim\fR.
TAIL
