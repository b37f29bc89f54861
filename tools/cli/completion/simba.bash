# bash completion for simba (Simba's command line).
#
# Installed as share/bash-completion/completions/simba, where bash-completion loads it on
# demand. Without bash-completion, or from a source tree:
#
#   source tools/cli/completion/simba.bash
#
# It needs nothing from bash-completion; when bash-completion is loaded, the command after
# `simba run|elect ... --` is completed with that command's own completion (_command_offset).
#
# The flags must match `simba COMMAND --help`: tests/cli/completion_test.sh checks that they do.

# Flags that take a value (the next word, or after '=').
_simba_value_flags=" --store --mutex --ttl --transition --timeout --kill-after --log-format --listen --refresh "

# Stores' URI schemes, for --store.
_simba_schemes="sqlite:// redis:// rediss:// redis-sentinel:// rediss-sentinel:// redis-cluster:// rediss-cluster:// postgresql:// mysql:// mariadb:// zookeeper:// etcd:// memory://"

_simba_flags_for() {
  case $1 in
    run)
      echo "--store --mutex --ttl --transition --wait --no-wait --timeout --kill-after" \
        "--verbose --log-format --help" ;;
    elect)
      echo "--store --mutex --ttl --transition --kill-after --verbose --log-format --help" ;;
    status) echo "--store --json --help" ;;
    release) echo "--store --mutex --force --help" ;;
    schema) echo "--store --help" ;;
    dashboard) echo "--store --listen --refresh --help" ;;
    doctor) echo "--store --json --timeout --help" ;;
  esac
}

# Sets COMPREPLY to the words of $1 that start with $2.
_simba_reply() {
  local word
  COMPREPLY=()
  for word in $1; do
    [[ $word == "$2"* ]] && COMPREPLY+=("$word")
  done
}

# Values of a flag: $1 the flag, $2 what has been typed of the value.
_simba_values() {
  local flag=$1 cur=$2 path entry
  case $flag in
    --log-format) _simba_reply "text json" "$cur" ;;
    --store)
      if [[ $cur == sqlite://* ]]; then
        # sqlite:///abs/path or sqlite://relative/path: complete the file.
        path=${cur#sqlite://}
        COMPREPLY=()
        while IFS= read -r entry; do
          [[ -d $entry ]] && entry+=/
          COMPREPLY+=("sqlite://$entry")
        done < <(compgen -f -- "$path")
      else
        _simba_reply "$_simba_schemes" "$cur"
      fi
      ;;
    --ttl | --transition | --timeout | --kill-after | --refresh)
      # Durations carry a unit.
      COMPREPLY=()
      [[ $cur =~ ^[0-9]+$ ]] && COMPREPLY=("${cur}ms" "${cur}s" "${cur}m" "${cur}h")
      ;;
    --listen) _simba_reply "127.0.0.1:8080 [::1]:8080" "$cur" ;;
    *) COMPREPLY=() ;;  # --mutex NAME: anything
  esac
}

_simba() {
  local line=${COMP_LINE:0:COMP_POINT}
  local -a words
  # Words as the user sees them: split at blanks only (bash also splits at ':' and '=',
  # which would cut sqlite:///x.db and --store=URI apart).
  read -r -a words <<<"$line"
  [[ -z $line || $line == *[[:blank:]] ]] && words+=("")
  local cword=$((${#words[@]} - 1))
  local cur=${words[cword]}
  COMPREPLY=()

  local commands="run elect status release schema dashboard doctor help"
  if ((cword == 1)); then
    if [[ $cur == -* ]]; then
      _simba_reply "--help --version -h" "$cur"
    else
      _simba_reply "$commands" "$cur"
    fi
    return 0
  fi

  local command=${words[1]}
  case $command in
    help)
      ((cword == 2)) && _simba_reply "$commands" "$cur"
      return 0
      ;;
    run | elect | status | release | schema | dashboard | doctor) ;;
    *) return 0 ;;
  esac

  # Where "--" ends simba's flags (run and elect), and which flags are there already.
  local i word dashdash=0 used=" "
  for ((i = 2; i < cword; i++)); do
    word=${words[i]}
    if [[ $word == -- ]]; then
      dashdash=$i
      break
    fi
    used+="${word%%=*} "
    if [[ $_simba_value_flags == *" $word "* ]]; then
      ((i++))  # its value
    fi
  done

  if ((dashdash > 0)); then
    # The command to run and its arguments.
    local j n=0 offset=-1
    for ((j = 1; j < ${#COMP_WORDS[@]}; j++)); do
      if [[ ${COMP_WORDS[j]} == -- ]]; then
        offset=$((j + 1))
        break
      fi
    done
    if ((offset > 0 && offset <= COMP_CWORD)) && declare -F _comp_command_offset >/dev/null; then
      _comp_command_offset "$offset"
    elif ((offset > 0 && offset <= COMP_CWORD)) && declare -F _command_offset >/dev/null; then
      _command_offset "$offset"
    elif ((cword == dashdash + 1)); then
      while IFS= read -r word; do
        [[ $word == _* && $cur != _* ]] && continue  # completion functions and the like
        COMPREPLY[n++]=$word
      done < <(compgen -c -- "$cur" | sort -u)
    else
      while IFS= read -r word; do
        [[ -d $word ]] && word+=/
        COMPREPLY[n++]=$word
      done < <(compgen -f -- "$cur")
      _simba_nospace_for_dirs
    fi
    return 0
  fi

  local prev=${words[cword - 1]}
  local prefix=""
  if [[ $cur == --*=* ]]; then
    # --flag=value
    prev=${cur%%=*}
    prefix=$prev=
    cur=${cur#*=}
  elif [[ $_simba_value_flags != *" $prev "* ]]; then
    prev=""
  fi

  if [[ -n $prev ]]; then
    _simba_values "$prev" "$cur"
    if ((${#COMPREPLY[@]} > 0)); then
      COMPREPLY=("${COMPREPLY[@]/#/$prefix}")
    fi
  else
    # Flags not given yet; --wait, --no-wait and --timeout exclude each other.
    local flag candidates=""
    for flag in $(_simba_flags_for "$command"); do
      [[ $used == *" $flag "* ]] && continue
      if [[ $flag == --wait || $flag == --no-wait || $flag == --timeout ]] &&
        [[ $used == *" --wait "* || $used == *" --no-wait "* || $used == *" --timeout "* ]]; then
        continue
      fi
      candidates+="$flag "
    done
    if [[ $command == run || $command == elect ]] && [[ -z $cur || $cur == -- ]]; then
      candidates+="-- "
    fi
    _simba_reply "$candidates" "$cur"
  fi

  _simba_nospace_for_dirs
  _simba_trim_wordbreaks "$prefix$cur"
  return 0
}

# No space after a directory or a URI scheme (the user goes on typing).
_simba_nospace_for_dirs() {
  local reply
  for reply in "${COMPREPLY[@]}"; do
    if [[ $reply == */ ]]; then
      compopt -o nospace 2>/dev/null
      return
    fi
  done
}

# bash replaces only the part of the word after its last word-break character (':', '=' or
# '@' in COMP_WORDBREAKS), so take what comes before it off the replies: --store=sqlite:///x.db
# is completed as "///x.db".
_simba_trim_wordbreaks() {
  local cur=$1 breaks="" i c
  for c in : = @; do
    [[ $COMP_WORDBREAKS == *"$c"* ]] && breaks+=$c
  done
  [[ -z $breaks || $cur != *["$breaks"]* ]] && return
  local before=${cur%"${cur##*["$breaks"]}"}
  for i in "${!COMPREPLY[@]}"; do
    COMPREPLY[i]=${COMPREPLY[i]#"$before"}
  done
}

complete -F _simba simba
