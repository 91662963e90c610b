"""The commands a POSIX/bash script calls, read statically: enough shell grammar for build scripts.

Used by the Dockerfile check to prove that every ``RUN`` line and ``docker/*.sh`` script calls only what the
DLC's base has. It understands command position after operators and reserved words, leading assignments,
``$(...)`` and backquote substitutions (recursively, quoted or not), function definitions, ``for`` word lists
and ``case`` patterns. What it cannot see (a command held in a variable, ``eval`` text) is reported as a
variable command and must be one the caller vouches for.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

RESERVED_LEADING = {"if", "then", "else", "elif", "while", "until", "do", "!", "{", "time"}
RESERVED_ENDING = {"fi", "done", "esac", "}"}
OPERATORS = {";", "&", "&&", "||", "|", "(", ")", ";;", "\n", "|&"}
BUILTINS = frozenset(
    """
    . : [ alias bg break builtin cd command continue declare echo eval exec exit export false fg getopts hash
    jobs kill let local printf pwd read readonly return set shift source test times trap true type typeset
    ulimit umask unalias unset wait
    """.split()
)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_REDIRECT = re.compile(r"[0-9]*(<<<|<<-?|<|>>?|<>|>\||&>>?|>&|<&)-?")
_FUNCTION = re.compile(r"^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_-]*)\s*\(\s*\)", re.M)


@dataclass(frozen=True)
class Call:
    name: str  # the command word as written (a path, a name, or "$VAR")
    context: str  # the shell text it came from, shortened, for messages


def _substitutions(text: str) -> tuple[str, list[str]]:
    """``text`` with each ``$(...)`` / backquote body replaced by a placeholder word, and those bodies."""
    bodies: list[str] = []
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$((", i):  # arithmetic: no commands inside
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            out.append("0")
            i = j
        elif text.startswith("$(", i):
            depth, j = 1, i + 2
            quote: str | None = None
            while j < len(text) and depth:
                ch = text[j]
                if quote:
                    if ch == quote:
                        quote = None
                    elif ch == "\\" and quote == '"':
                        j += 1
                elif ch in "'\"":
                    quote = ch
                elif ch == "(":
                    depth += 1
                elif ch == ")":
                    depth -= 1
                j += 1
            bodies.append(text[i + 2 : j - 1])
            out.append("SUBST")
            i = j
        elif text[i] == "`":
            j = text.find("`", i + 1)
            j = len(text) if j < 0 else j
            bodies.append(text[i + 1 : j])
            out.append("SUBST")
            i = j + 1
        elif text[i] == "\\" and i + 1 < len(text):
            out.append("_")  # an escaped character is part of a word ("\\(" is no operator)
            i += 2
        elif text[i] == "'":  # single quotes: literal, no substitution inside
            j = text.find("'", i + 1)
            j = len(text) if j < 0 else j
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out), bodies


def _tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace = " \t\r"  # newlines separate commands: keep them as tokens
    lexer.commenters = "#"
    lexer.wordchars += "$[]{}*?=/.,:-+@%^~!"
    tokens: list[str] = []
    for token in lexer:
        tokens.extend(["\n"] * token.count("\n") if token.strip() == "" else [token])
    return tokens


def calls(script: str) -> list[Call]:
    """Every command word in ``script``, in order, including those inside command substitutions."""
    text = re.sub(r"\\\n", " ", script)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    flat, bodies = _substitutions(text)
    found: list[Call] = []
    for body in bodies:
        found += calls(body)
    tokens = _tokens(flat)
    at_command = True
    skip_until: set[str] | None = None  # inside "for x in ...": words until ; or newline
    in_case = 0
    case_pattern = False
    redirect_target = False
    for index, token in enumerate(tokens):
        if redirect_target:
            redirect_target = False
            continue
        if _REDIRECT.fullmatch(token):
            redirect_target = True  # the file or descriptor it names is no command
            continue
        if skip_until is not None:
            if token in skip_until:
                case_pattern = token == "in" and in_case > 0
                skip_until = None
                at_command = True
            continue
        if case_pattern:
            if token == ")":
                case_pattern = False
                at_command = True
            elif token == "esac":
                case_pattern, in_case = False, in_case - 1
            continue
        if token == "()":  # after a function name: the body follows
            at_command = True
            continue
        if token in OPERATORS:
            if token == ";;" and in_case:
                case_pattern = True
            at_command = token != ")" or not in_case
            if token == ")" and tokens[index - 1] == "(":
                at_command = False  # "name()" of a function definition
            continue
        if not at_command:
            continue
        if token in RESERVED_LEADING:
            continue
        if token in RESERVED_ENDING:
            if token == "esac":
                in_case -= 1
            at_command = False
            continue
        if token == "for":
            skip_until = {";", "\n"}
            continue
        if token == "case":
            in_case += 1
            skip_until = {"in"}  # the case word, then the patterns
            continue
        if _ASSIGNMENT.match(token):
            continue
        if token.isdigit() and index + 1 < len(tokens) and _REDIRECT.fullmatch(tokens[index + 1]):
            continue  # "2>/dev/null": a descriptor number, not a command
        if tokens[index + 1 : index + 2] == ["()"] or tokens[index + 1 : index + 3] == ["(", ")"]:
            at_command = False  # a function definition's name
            continue
        found.append(Call(token, " ".join(flat.split())[:120]))
        at_command = token == "exec"  # "exec cmd": cmd runs too
    return found


def functions(script: str) -> set[str]:
    """Names of the shell functions a script defines (calling them is fine)."""
    return set(_FUNCTION.findall(script))
