#!/usr/bin/env python3
"""The shape rules of the product's C++ (issue 30): no function over 60 lines, no class or
struct with more than 15 data members.

Usage: code_shape.py SOURCE_DIR [--max-lines N] [--max-members N] [--report]

Reads every .h and .cc under services/ and gpu_worker/ of SOURCE_DIR and prints one line per
offence, `path:line: what`; exits 1 if there is any. --report prints the longest functions and
the largest classes too, for looking before a rule bites.

Why a scanner of our own instead of pmccabe or lizard: pmccabe stops at C++11 raw strings
(R"(...)") and loses the rest of the file silently, and a libclang walk needs the build's
compile commands and minutes of parsing. Our code is clang-formatted, so a scanner that knows
comments, strings, raw strings and braces is enough:
  1. Comments and literals are blanked (their newlines kept, so line numbers hold).
  2. Braces are matched. A `{` opened where declarations live (file, namespace, class scope)
     opens a function body when the text since the previous `;`, `{` or `}` holds a `)` and
     is not a class head; a class when it starts with class/struct/union; a namespace; else
     a plain block (an initializer, `extern "C"`, an enum).
  3. A function's length runs from the first line of its declaration to its closing brace;
     lambdas and blocks inside count toward it.
  4. A class's data members are the names ending in `_` declared by its own statements
     (functions and nested classes excluded): the project names members `name_`, and plain
     option structs, whose fields have no `_`, are settings rather than state.
"""
import os
import re
import sys

ROOTS = ("services", "gpu_worker")
CLASS_HEAD = re.compile(r"^(?:template\s*<[^{]*>\s*)?(class|struct|union)\b")
ENUM_HEAD = re.compile(r"^enum\b")
MEMBER_NAME = re.compile(r"\b([a-z][a-z0-9_]*_)\s*(?=$|=|\{|,|\[|:)")


def blank(text):
    """Comments and string/char literals replaced by spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delimiter = text[i + 2:open_paren]
            close = text.find(")" + delimiter + '"', open_paren)
            j = n if close < 0 else close + len(delimiter) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def scan(path, text):
    """Yields ('function', name, first_line, lines) and ('class', name, line, members)."""
    code = blank(text)
    line_of = []
    line = 1
    for ch in code:
        line_of.append(line)
        if ch == "\n":
            line += 1
    # Each scope: kind, statement start offset, name, and for classes their statements.
    stack = [{"kind": "namespace"}]
    statement_start = 0
    i = 0
    while i < len(code):
        ch = code[i]
        scope = stack[-1]
        if scope["kind"] in ("function", "block_in_function"):
            if ch == "{":
                stack.append({"kind": "block_in_function"})
            elif ch == "}":
                done = stack.pop()
                if done["kind"] == "function":
                    first = line_of[done["start"]]
                    yield ("function", done["name"], first, line_of[i] - first + 1)
                    statement_start = i + 1
            i += 1
            continue
        if ch == ";":
            if scope["kind"] == "class":
                scope["statements"].append(code[statement_start:i])
            statement_start = i + 1
        elif ch == "{":
            head = code[statement_start:i].strip()
            start = statement_start + (len(code[statement_start:i]) - len(code[statement_start:i].lstrip()))
            if CLASS_HEAD.match(head) and "(" not in head.split(":")[0]:
                name = re.split(r"[\s:]+", CLASS_HEAD.sub("", head).strip() or "?")[0]
                if "final" == name:
                    name = "?"
                stack.append({"kind": "class", "name": name or "?", "start": start, "statements": []})
            elif head.startswith("namespace") or head.startswith('extern'):
                stack.append({"kind": "namespace"})
            elif ")" in head and not ENUM_HEAD.match(head) and not head.endswith("="):
                name = re.findall(r"([~\w:]+)\s*\(", head)
                stack.append({"kind": "function", "name": name[0] if name else "?", "start": start})
            else:
                stack.append({"kind": "block", "start": start})
            if stack[-1]["kind"] != "block" or scope["kind"] != "class":
                statement_start = i + 1  # a brace initializer of a member goes on to its `;`
        elif ch == "}":
            done = stack.pop() if len(stack) > 1 else scope
            if done["kind"] == "class":
                members = count_members(done["statements"])
                yield ("class", done["name"], line_of[done["start"]], members)
            if not (done["kind"] == "block" and stack[-1]["kind"] == "class"):
                statement_start = i + 1
        i += 1


def count_members(statements):
    names = set()
    for statement in statements:
        text = " ".join(statement.split())
        if not text or re.match(r"^(public|private|protected)\s*:", text):
            text = re.sub(r"^(public|private|protected)\s*:\s*", "", text)
        if not text or re.match(r"^(using|friend|typedef|static_assert|enum)\b", text):
            continue
        declarator = text.split("=")[0]
        if "(" in declarator.replace("std::function<", "").split("<")[0] and not re.search(r"\w_\s*$", declarator):
            continue  # a function declaration
        if "(" in declarator and not re.search(r"\w_\s*(\[.*\])?\s*$", declarator.split(",")[0]):
            continue
        for name in MEMBER_NAME.findall(text.split("=")[0] if "," not in text else text):
            names.add(name)
    return len(names)


def self_test():
    """The scanner on samples whose answers are known: a raw string that pmccabe loses, a
    function of exactly the limit and one past it, a class's members, an options struct."""
    body = "\n".join("  x += %d;" % k for k in range(58))
    sample = (
        'namespace a {\n'
        'const char* kJson = R"({"a": "}{"})";\n'
        'int Fits(int x) {\n' + body + '\n  return x;\n}\n'            # 61 lines with its braces
        'int Longer(int x)\n    const {\n' + body + '\n  return x;\n}\n'  # 62: from the signature's first line
        'class Holder {\n public:\n  int get() const { return a_; }\n'
        '  Holder() : a_(1), b_(2) {}\n private:\n  int a_ = 0, b_ = 0;\n'
        '  std::vector<int> c_{1, 2};\n  std::function<void(int)> d_;\n  // e_;\n};\n'
        'struct Options { int plain = 0; };\n'
        '}  // namespace a\n')
    found = {(kind, name): size for kind, name, _, size in scan("sample.cc", sample)}
    expected = {("function", "Fits"): 61, ("function", "Longer"): 62,
                ("class", "Holder"): 4, ("class", "Options"): 0}
    for key, size in expected.items():
        if found.get(key) != size:
            print(f"code_shape self-test: {key} measured {found.get(key)}, expected {size}")
            return 1
    print("code_shape self-test: ok")
    return 0


def main(argv):
    if "--self-test" in argv:
        return self_test()
    source = argv[1] if len(argv) > 1 and not argv[1].startswith("--") else "."
    max_lines = int(argv[argv.index("--max-lines") + 1]) if "--max-lines" in argv else 60
    max_members = int(argv[argv.index("--max-members") + 1]) if "--max-members" in argv else 15
    report = "--report" in argv
    offences, functions, classes = [], [], []
    for root in ROOTS:
        for directory, _, files in os.walk(os.path.join(source, root)):
            for file in sorted(files):
                if not file.endswith((".h", ".cc")):
                    continue
                path = os.path.join(directory, file)
                relative = os.path.relpath(path, source)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for kind, name, line, size in scan(relative, text):
                    where = f"{relative}:{line}"
                    if kind == "function":
                        functions.append((size, where, name))
                        if size > max_lines:
                            offences.append(f"{where}: function {name} has {size} lines (at most {max_lines})")
                    else:
                        classes.append((size, where, name))
                        if size > max_members:
                            offences.append(f"{where}: class {name} has {size} data members (at most {max_members})")
    if report:
        print("longest functions:")
        for size, where, name in sorted(functions, reverse=True)[:15]:
            print(f"  {size:4d} {where} {name}")
        print("largest classes (data members):")
        for size, where, name in sorted(classes, reverse=True)[:15]:
            print(f"  {size:4d} {where} {name}")
    for offence in offences:
        print(offence)
    print(f"code_shape: {len(functions)} functions, {len(classes)} classes, {len(offences)} over the limits")
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
