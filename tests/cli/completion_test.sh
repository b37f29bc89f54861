#!/usr/bin/env bash
# Tests tools/cli/completion/simba.bash in a plain bash, without bash-completion: sets COMP_LINE,
# COMP_POINT, COMP_WORDS and COMP_CWORD as bash does for a command line, calls the completion
# function and checks COMPREPLY. Flags and commands are taken from `simba --help` and
# `simba COMMAND --help`, so the completion cannot drift from the program.
#
#   completion_test.sh path/to/simba path/to/simba.bash
set -u

if (($# != 2)); then
  echo "usage: $0 SIMBA COMPLETION_FILE" >&2
  exit 2
fi
simba=$1
completion=$2
failures=0
checks=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# As in an interactive bash (this one is not interactive).
COMP_WORDBREAKS=$' \t\n"\'@><=;|&(:'
# compopt works only while bash completes; record what is asked for.
nospace=0
compopt() {
  [[ $* == *nospace* ]] && nospace=1
  return 0
}
if declare -F _command_offset >/dev/null || declare -F _comp_command_offset >/dev/null; then
  echo "bash-completion is loaded; this test is about the completion without it" >&2
  exit 2
fi
# shellcheck source=/dev/null
source "$completion" || {
  echo "FAIL: cannot source $completion" >&2
  exit 1
}
if ! complete -p simba >/dev/null 2>&1; then
  fail "the completion file does not register a completion for 'simba'"
fi
completer=$(complete -p simba 2>/dev/null | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
[[ -n $completer ]] || {
  echo "FAIL: 'complete -p simba' names no function" >&2
  exit 1
}

# complete LINE: the replies (sorted, one per line) for the cursor at the end of LINE.
# COMP_WORDS is split as bash splits it: at blanks, and at ':' and '=' (a run of them is a
# word of its own).
complete_line() {
  local line=$1 word="" c i
  COMP_LINE=$line
  COMP_POINT=${#line}
  COMP_WORDS=()
  for ((i = 0; i < ${#line}; i++)); do
    c=${line:i:1}
    if [[ $c == [[:blank:]] ]]; then
      [[ -n $word ]] && COMP_WORDS+=("$word")
      word=""
    elif [[ $c == [:=] ]]; then
      if [[ -n $word && $word == *[!:=]* ]]; then
        COMP_WORDS+=("$word")
        word=""
      fi
      word+=$c
    else
      if [[ -n $word && $word != *[!:=]* ]]; then
        COMP_WORDS+=("$word")
        word=""
      fi
      word+=$c
    fi
  done
  COMP_WORDS+=("$word")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  nospace=0
  "$completer" simba "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
  if ((${#COMPREPLY[@]} > 0)); then
    printf '%s\n' "${COMPREPLY[@]}" | LC_ALL=C sort
  fi
}

sorted() { printf '%s\n' "$@" | sed '/^$/d' | LC_ALL=C sort -u; }

# expect LINE WORD...: the replies are exactly WORD...
expect() {
  local line=$1
  shift
  local got want
  checks=$((checks + 1))
  got=$(complete_line "$line")
  want=$(sorted "$@")
  if [[ $got != "$want" ]]; then
    fail "'$line<TAB>' offers:"$'\n'"${got:-(nothing)}"$'\n'"expected:"$'\n'"${want:-(nothing)}"
  fi
}

# expect_has LINE WORD...: the replies include every WORD.
expect_has() {
  local line=$1 word got
  shift
  got=$(complete_line "$line")
  for word in "$@"; do
    checks=$((checks + 1))
    grep -qxF -- "$word" <<<"$got" || fail "'$line<TAB>' does not offer '$word'; it offers: ${got//$'\n'/ }"
  done
}

# expect_lacks LINE WORD...: the replies include no WORD.
expect_lacks() {
  local line=$1 word got
  shift
  got=$(complete_line "$line")
  for word in "$@"; do
    checks=$((checks + 1))
    if grep -qxF -- "$word" <<<"$got"; then fail "'$line<TAB>' offers '$word'"; fi
  done
}

# ---- what the help says ------------------------------------------------------------------------

top_help=$("$simba" --help) || {
  echo "FAIL: '$simba --help' failed" >&2
  exit 1
}
# The items of a "heading:" list of the help, first word of each.
list_items() { sed -n "/^$1:\$/,/^\$/p" | sed -n 's/^  \([^ ]\{1,\}\).*/\1/p'; }
mapfile -t commands < <(list_items commands <<<"$top_help")
((${#commands[@]} >= 6)) || fail "'simba --help' lists only these commands: ${commands[*]}"
# Every --flag of a help text outside its example, and the flags of its "options:" list.
help_flags() { sed '/^example/,$d' | grep -oE -- '(^|[^[:alnum:]-])--[a-z][a-z-]*' | grep -oE -- '--[a-z-]+' | sort -u; }
option_flags() { list_items options | grep -E -- '^--' | sort -u; }

# ---- top level ---------------------------------------------------------------------------------

expect "simba " "${commands[@]}"
mapfile -t st < <(printf '%s\n' "${commands[@]}" | grep '^st')
expect "simba st" "${st[@]}"
expect "simba --" --help --version
expect "simba help " "${commands[@]}"
expect "simba help da" dashboard
expect "simba help run " # nothing after the command

# ---- each command's flags, from its help -------------------------------------------------------

for command in "${commands[@]}"; do
  [[ $command == help ]] && continue
  help=$("$simba" "$command" --help) || {
    fail "'simba $command --help' failed"
    continue
  }
  mapfile -t options < <(option_flags <<<"$help")
  ((${#options[@]} > 0)) || fail "'simba $command --help' lists no options"
  extra=(--help)
  [[ $command == run || $command == elect ]] && extra+=(--)  # "-- CMD"
  # Exactly the listed flags: none missing, none the command does not have.
  expect "simba $command --" "${options[@]}" "${extra[@]}"
  expect "simba $command " "${options[@]}" "${extra[@]}"
  # Every flag the help mentions anywhere (usage line, text) is offered.
  mapfile -t mentioned < <(help_flags <<<"$help")
  expect_has "simba $command --" "${mentioned[@]}"
  # A flag given already is not offered again.
  expect_lacks "simba $command --store memory://x --" --store
done

# ---- values ------------------------------------------------------------------------------------

for command in run elect; do
  expect "simba $command --log-format " text json
  expect "simba $command --log-format j" json
  expect "simba $command --log-format=" text json
  expect "simba $command --store m --mutex m --log-format=t" text
done
grep -q 'text (default) or json' <<<"$("$simba" run --help)" ||
  fail "'simba run --help' no longer says '--log-format F  text (default) or json': update the completion"

schemes=(sqlite:// redis:// rediss:// redis-sentinel:// rediss-sentinel:// redis-cluster:// rediss-cluster:// postgresql:// mysql:// mariadb:// zookeeper:// etcd:// memory://)
for command in run elect status release schema dashboard doctor; do
  expect "simba $command --store " "${schemes[@]}"
done
complete_line "simba run --store " >/dev/null  # not in a subshell: nospace is set here
checks=$((checks + 1))
((nospace == 1)) || fail "no 'compopt -o nospace' after a URI scheme"
# Every store the top-level help names is offered.
mapfile -t help_schemes < <(list_items stores <<<"$top_help" | grep -oE '^[a-z]+://')
((${#help_schemes[@]} >= 7)) || fail "'simba --help' lists only these stores: ${help_schemes[*]}"
expect_has "simba status --store " "${help_schemes[@]}"
expect "simba run --store sq" sqlite://
expect "simba run --store=red" redis:// redis-cluster:// redis-sentinel:// rediss:// rediss-cluster:// rediss-sentinel://
# bash took "sqlite" and ":" for words of their own: the reply replaces what follows ':'.
expect "simba run --store sqlite:" //
expect "simba run --store=me" memory://
expect "simba run --store=m" mariadb:// memory:// mysql://

# sqlite:// completes files.
mkdir -p "$tmp/dir.d"
touch "$tmp/jobs.db" "$tmp/dir.d/x.db"
expect "simba run --store sqlite://$tmp/" "//$tmp/jobs.db" "//$tmp/dir.d/"
expect "simba status --store sqlite://$tmp/j" "//$tmp/jobs.db"
expect "simba status --store=sqlite://$tmp/dir.d/" "//$tmp/dir.d/x.db"
expect "simba run --store sqlite://$tmp/nothing-here" # nothing

# Durations, --listen, free-form values.
expect "simba run --ttl 5" 5ms 5s 5m 5h
expect "simba run --timeout 30" 30ms 30s 30m 30h
expect "simba dashboard --refresh 2" 2ms 2s 2m 2h
expect "simba run --ttl " # nothing: any duration
expect "simba run --mutex " # nothing: any name
expect "simba dashboard --listen " 127.0.0.1:8080 "[::1]:8080"

# --wait, --no-wait and --timeout exclude each other.
expect_lacks "simba run --no-wait --" --wait --no-wait --timeout
expect_lacks "simba run --timeout 5s --" --wait --no-wait --timeout
expect_has "simba run --timeout 5s --" --store --mutex --verbose --log-format
expect "simba status --json --" --store --help

# ---- after "--": the command to run ------------------------------------------------------------

expect_has "simba run --store memory://x --mutex m -- bas" bash
expect_has "simba elect --store=sqlite:///tmp/x.db --mutex m -- ech" echo
expect_lacks "simba run --mutex m -- " _simba
expect "simba run --mutex m -- ls $tmp/jo" "$tmp/jobs.db"
expect_lacks "simba run --mutex m -- ls --store " "${schemes[@]}" # the command's, not simba's
expect_lacks "simba run --mutex m -- ls --" --store --mutex

# With bash-completion, its _command_offset completes the command: check simba hands it the
# right word of COMP_WORDS (bash split sqlite:///x.db into three).
# shellcheck disable=SC2317  # called by the completion
_command_offset() { offset_called=$1; }
offset_called=""
complete_line "simba run --store sqlite:///x.db --mutex m -- ls -" >/dev/null
checks=$((checks + 1))
[[ $offset_called == 9 ]] || fail "_command_offset got '$offset_called', expected 9 (the word after --)"
offset_called=""
complete_line "simba run --store sqlite:///x.db --mutex m --" >/dev/null
checks=$((checks + 1))
[[ -z $offset_called ]] || fail "_command_offset was called before the command ('--' is being typed)"
unset -f _command_offset

if ((failures > 0)); then
  echo "$failures of $checks checks failed" >&2
  exit 1
fi
echo "completion: $checks checks passed"
