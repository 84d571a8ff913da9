# bash completion for moesim (installed as share/bash-completion/completions/moesim). Commands and
# options come from the program's own --help; names of models, hardware profiles, policy presets
# and plot scripts from the data folders it searches ($MOESIM_DATA_PATH, then ../share/moesim
# beside the executable).

# The data folders, one a line.
_moesim_data_dirs() {
    local IFS=: d bin
    for d in ${MOESIM_DATA_PATH:-}; do [ -n "$d" ] && echo "$d"; done
    bin=$(command -v "$1" 2>/dev/null) || return 0
    bin=$(readlink -f "$bin")
    echo "${bin%/*}/../share/moesim"
}

# The stems of DATA/SUB/*.EXT over the data folders.
_moesim_names() { # program, sub, ext
    local d f
    while read -r d; do
        for f in "$d/$2"/*."$3"; do [ -e "$f" ] && f=${f##*/} && echo "${f%."$3"}"; done
    done < <(_moesim_data_dirs "$1")
}

# "  name   summary" lines after "commands:" in a --help text.
_moesim_commands() {
    "$@" --help 2>/dev/null | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { on = 0 }'
}

_moesim() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]} prog=${COMP_WORDS[0]}
    local cmd="" sub="" i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        [ "${COMP_WORDS[i - 1]}" = --data-dir ] && continue
        case $w in -*) continue ;; esac
        if [ -z "$cmd" ]; then cmd=$w; elif [ "$cmd" = trace ] && [ -z "$sub" ]; then sub=$w; fi
    done
    case $prev in
    --model) mapfile -t COMPREPLY < <(compgen -W "$(_moesim_names "$prog" configs/models ini)" -- "$cur"); compopt -o default 2>/dev/null || :; return ;;
    --hw) mapfile -t COMPREPLY < <(compgen -W "$(_moesim_names "$prog" configs/hw ini)" -- "$cur"); compopt -o default 2>/dev/null || :; return ;;
    --config) mapfile -t COMPREPLY < <(compgen -W "$(_moesim_names "$prog" configs/policies ini)" -- "$cur"); compopt -o default 2>/dev/null || :; return ;;
    --data-dir) mapfile -t COMPREPLY < <(compgen -d -- "$cur"); return ;;
    --trace | --csv | -o | --timeline | --input | --experiment) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
    esac
    if [ -z "$cmd" ]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_moesim_commands "$prog") --data-dir --version --help" -- "$cur")
        return
    fi
    if [ "$cmd" = trace ] && [ -z "$sub" ] && [[ $cur != -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_moesim_commands "$prog" trace)" -- "$cur")
        return
    fi
    if [[ $cur == -* ]]; then
        local help
        help=$("$prog" $cmd $sub --help 2>/dev/null)
        mapfile -t COMPREPLY < <(compgen -W "$(grep -oE -- '--[a-z][a-z0-9-]*' <<<"$help" | sort -u) --data-dir" -- "$cur")
        return
    fi
    case $cmd in
    plot) mapfile -t COMPREPLY < <(compgen -W "$(_moesim_names "$prog" plots gp)" -- "$cur") ;;
    *) mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
    esac
}
complete -F _moesim moesim
