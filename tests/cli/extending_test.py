#!/usr/bin/python3
"""docs/extending.md held against the registries of a built qattn: every method, KV and weight quantizer, kernel
variant, experiment and MMA preset lives in exactly the files the page names, and no such file holds something the
registry does not know. Usage: extending_test.py QATTN SOURCE_ROOT. Prints each broken rule and exits 1."""
import glob
import json
import os
import re
import subprocess
import sys

qattn, root = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def run(*args):
    return subprocess.run([qattn, *args], check=True, capture_output=True, text=True).stdout


def read(path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def stems(pattern, suffix):
    return {os.path.basename(p)[: -len(suffix)] for p in glob.glob(os.path.join(root, pattern))}


entries = json.loads(run("methods", "--format", "json"))
methods = [e for e in entries if not e["summary"].startswith("[")]
kv = sorted(e["name"] for e in entries if e["summary"].startswith("[--kv] "))
weights = sorted(e["name"] for e in entries if e["summary"].startswith("[--weights] "))
check(len(methods) + len(kv) + len(weights) == len(entries), "qattn methods: an entry of no known registry")

# Methods: named in double quotes on the first line of exactly one method file, in the folder of its kind.
folder_of_kind = {"float format": "softmax", "softmax model": "softmax", "attention pipeline": "pipelines"}
method_files = glob.glob(os.path.join(root, "reference/src/*/*_method.cc")) + \
    glob.glob(os.path.join(root, "reference/src/*/*_methods.cc"))
first_lines = {}
for path in method_files:
    with open(path, encoding="utf-8") as f:
        first_lines[os.path.relpath(path, root)] = f.readline()
named = set()
for e in methods:
    owners = [p for p, line in first_lines.items() if '"%s"' % e["name"] in line]
    check(len(owners) == 1, "method %s: named on the first line of %d method files, not 1: %s" %
          (e["name"], len(owners), owners))
    for p in owners:
        check(p.split("/")[2] == folder_of_kind.get(e["kind"]),
              "method %s (%s) is registered in %s, not under reference/src/%s/" %
              (e["name"], e["kind"], p, folder_of_kind.get(e["kind"])))
    check(os.path.isfile(os.path.join(root, e["doc"])), "method %s: its doc page %s does not exist" % (e["name"], e["doc"]))
    named.add(e["name"])
for p, line in first_lines.items():
    quoted = set(re.findall(r'"([a-z0-9-]+)"', line))
    check(quoted and quoted <= named, "%s: its first line names %s, registered are only %s" %
          (p, sorted(quoted), sorted(quoted & named)))

# KV and weight quantizers: one file each, named after the quantizer, and documented.
quantizers_doc = read("docs/quantizers.md")
readme = read("README.md")
kv_row = next((line for line in readme.splitlines() if line.startswith("| `qattn analyze --kv")), "")
check(stems("reference/src/quantizers/*_kv.cc", "_kv.cc") == set(kv),
      "KV quantizer files %s differ from the registry's %s" %
      (sorted(stems("reference/src/quantizers/*_kv.cc", "_kv.cc")), kv))
for kind, names in (("kv", kv), ("weights", weights)):
    for name in names:  # the file of that name registers that name
        path = "reference/src/quantizers/%s_%s.cc" % (name, kind)
        if os.path.isfile(os.path.join(root, path)):
            check('r.add({{"%s"' % name in read(path), "%s does not register %s" % (path, name))
for name in kv:
    check("### `%s`" % name in quantizers_doc, "KV quantizer %s: no '### `%s`' section in docs/quantizers.md" % (name, name))
    check("`%s`" % name in kv_row, "KV quantizer %s: not named in README's `qattn analyze --kv` row" % name)
check(stems("reference/src/quantizers/*_weights.cc", "_weights.cc") == set(weights),
      "weight quantizer files %s differ from the registry's %s" %
      (sorted(stems("reference/src/quantizers/*_weights.cc", "_weights.cc")), weights))
for name in weights:
    check("reference/src/quantizers/%s_weights.cc" % name in quantizers_doc,
          "weight quantizer %s: docs/quantizers.md does not name its file" % name)

# Kernel variants: each part a row names is declared in kernels.h and defined in a kernels/src file whose ISA suffix
# is the kernel's (the name after "__" starts with it; scalar kernels in *_scalar.cc or the ISA-free files).
rows = read("kernels/src/kernel_variants.cc")
declarations = read("kernels/include/qattn/kernels.h")
suffixes = ["avx512vnni", "avxvnni", "avx512", "avx2", "amx", "neon_dotprod", "neon_i8mm", "neon", "scalar"]
kernels = sorted(set(re.findall(r"^\s+QATTN_KERNEL\(\w+, (\w+)\)", rows, re.M)))
check(len(kernels) > 10, "kernel_variants.cc: %d kernels found in its rows" % len(kernels))
sources = {os.path.relpath(p, root): open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(root, "kernels/src/*.cc"))}
for k in kernels:
    check(re.search(r"\b%s\(" % k, declarations) is not None, "kernel %s: not declared in kernels.h" % k)
    isa = next((s for s in suffixes if k.split("__", 1)[-1].startswith(s)), None)
    # a definition starts at column 0 with its return type; calls (the ISA files' scalar tails) are indented
    homes = [p for p, text in sources.items() if re.search(r"^\w[\w:<>*& ]*\b%s\(" % k, text, re.M)]
    check(len(homes) == 1, "kernel %s: defined in %d files of kernels/src, not 1: %s" % (k, len(homes), homes))
    for p in homes:
        check(isa is not None and (p.endswith("_%s.cc" % isa) or (isa == "scalar" and not any(
            p.endswith("_%s.cc" % s) for s in suffixes if s != "scalar"))),
              "kernel %s: defined in %s, whose name does not carry its ISA suffix %s" % (k, p, isa))

# Experiments: the listed ones and the folders whose experiment.cmake sets a claim are the same set, each with its
# files, its code (experiment.cc's run function, or the program experiment.cmake builds) and its row.
listed = {line.split("|")[1].strip() for line in run("reproduce", "--list").splitlines()[2:] if line.startswith("|")}
settings = {os.path.basename(os.path.dirname(p)): read(os.path.relpath(p, root))
            for p in glob.glob(os.path.join(root, "experiments/*/experiment.cmake"))}
declared = {name for name, text in settings.items() if re.search(r"^set\(experiment_claim ", text, re.M)}
check(listed == declared, "experiments listed %s, folders whose experiment.cmake sets experiment_claim %s" %
      (sorted(listed - declared), sorted(declared - listed)))
coded = {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(root, "experiments/*/experiment.cc"))}
coded.discard("common")
check(coded <= declared, "folders with experiment.cc but no experiment_claim: %s" % sorted(coded - declared))
experiments_doc = read("docs/experiments.md")
for name in sorted(listed & declared):
    for f in ("README.md", "expected.txt"):
        check(os.path.isfile(os.path.join(root, "experiments", name, f)), "experiment %s: no %s" % (name, f))
    check(re.search(r"^set\(experiment_source ", settings[name], re.M) is not None,
          "experiment %s: experiment.cmake sets no experiment_source" % name)
    program = re.search(r"^set\(experiment_executable (\w+)\)", settings[name], re.M)
    if program:
        check(name not in coded and "add_executable(%s " % program.group(1) in settings[name],
              "experiment %s: the program %s, but experiment.cmake does not build it or experiment.cc exists" %
              (name, program.group(1)))
    else:
        ident = name.replace("-", "_")
        check(name in coded and re.search(r"^std::string run_%s\(const ExperimentContext&" % ident,
                                          read("experiments/%s/experiment.cc" % name), re.M) is not None,
              "experiment %s: no experiment.cc defining run_%s(const ExperimentContext&)" % (name, ident))
    check(re.search(r"experiments/%s(?![\w-])" % re.escape(name), experiments_doc) is not None,
          "experiment %s: no row in docs/experiments.md" % name)

# MMA presets: a row in docs/mma.md's table, and a test of golden vectors unless `qattn mma --list` says none.
mma_doc = read("docs/mma.md")
exact_tests = read("tests/exact/h100_mma_test.cc") + read("tests/exact/mma_models_test.cc")
presets = [line for line in run("mma", "--list").splitlines() if line and not line.startswith(" ")]
check(len(presets) > 5, "qattn mma --list: %d presets" % len(presets))
for line in presets:
    name = line.split()[0]
    check(any(row.startswith("| `") and "`%s`" % name in row.split("|")[1] for row in mma_doc.splitlines()),
          "MMA preset %s: no row in docs/mma.md's preset tables" % name)
    if "not validated by vectors" not in line:
        check('"%s"' % name in exact_tests,
              "MMA preset %s: named by neither tests/exact/h100_mma_test.cc nor mma_models_test.cc" % name)

# Size: no source file over 700 lines; functions over 80 lines outside tests/, fuzz/ and bench/ are exactly the ones
# docs/extending.md's "Size" table lists (at most 6), each with its length to within 10 lines.
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_LONG_FUNCTIONS = 700, 80, 6
SOURCE_SUFFIXES = (".cc", ".h", ".py", ".sh", ".cmake")
SKIPPED_DIRS = {"data", "fixtures", "__pycache__"}


def source_files():
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build")) and d not in SKIPPED_DIRS)
        for f in sorted(files):
            if f.endswith(SOURCE_SUFFIXES) or f == "CMakeLists.txt":
                yield os.path.relpath(os.path.join(top, f), root)


FUNCTION_HEAD = re.compile(r"\)\s*(const\s*)?(override\s*)?(noexcept\s*)?(->\s*[\w:<>&*, ]+)?\{")
NOT_FUNCTION = re.compile(r"\s*(namespace|struct|class|enum|union|extern)\b")


def long_functions(path, text):
    """(first line, lines, head) of each outermost function body over MAX_FUNCTION_LINES lines, braces matched on
    code with comments and literals blanked: a function starts on a line whose code ends a parameter list with '{'."""
    found, depth, start = [], 0, None
    in_block_comment = False
    for number, line in enumerate(text.split("\n"), 1):
        code = line
        if in_block_comment:
            if "*/" not in code:
                continue
            code, in_block_comment = code.split("*/", 1)[1], False
        code = re.sub(r"/\*.*?\*/", "", code)
        if "/*" in code:
            code, in_block_comment = code.split("/*", 1)[0], True
        code = re.sub(r"//.*", "", code)
        code = re.sub(r'"(\\.|[^"\\])*"', '""', code)
        code = re.sub(r"'(\\.|[^'\\])*'", "''", code)
        for ch in code:
            if ch == "{":
                if start is None and FUNCTION_HEAD.search(code) and not NOT_FUNCTION.match(code):
                    start, start_depth, head = number, depth, code.strip()
                depth += 1
            elif ch == "}":
                depth -= 1
                if start is not None and depth == start_depth:
                    if number - start + 1 > MAX_FUNCTION_LINES:
                        found.append((start, number - start + 1, head))
                    start = None
    return found


size_doc = read("docs/extending.md").split("\n## Size", 1)
check(len(size_doc) == 2, "docs/extending.md: no '## Size' section")
listed_long = {}
for row in (size_doc[1] if len(size_doc) == 2 else "").splitlines():
    m = re.match(r"\| `([^`]+)` \| `([^`]+)` \| (\d+) \|", row)
    if m:
        listed_long[(m.group(1), m.group(2))] = int(m.group(3))
check(len(listed_long) <= MAX_LONG_FUNCTIONS, "docs/extending.md lists %d long functions, more than %d" %
      (len(listed_long), MAX_LONG_FUNCTIONS))
measured_long = {}
for path in source_files():
    text = read(path)
    lines = text.count("\n")
    check(lines <= MAX_FILE_LINES, "%s: %d lines, over %d" % (path, lines, MAX_FILE_LINES))
    if path.endswith((".cc", ".h")) and not path.startswith(("tests/", "fuzz/", "bench/")):
        for first, length, head in long_functions(path, text):
            name = re.search(r"([\w:~]+)\s*\(", head)
            measured_long[(path, name.group(1) if name else head)] = (first, length)
for key, (first, length) in sorted(measured_long.items()):
    check(key in listed_long and abs(listed_long[key] - length) <= 10,
          "%s:%d: %s, %d lines, is over %d and not in docs/extending.md's Size table with that length" %
          (key[0], first, key[1], length, MAX_FUNCTION_LINES))
for key in sorted(set(listed_long) - set(measured_long)):
    check(False, "docs/extending.md's Size table lists %s in %s, which is no longer over %d lines" %
          (key[1], key[0], MAX_FUNCTION_LINES))

for f in failures:
    print("FAIL: " + f)
print("extending: %d methods, %d KV and %d weight quantizers, %d kernels, %d experiments, %d MMA presets, %d long "
      "functions; %d failures" % (len(methods), len(kv), len(weights), len(kernels), len(listed), len(presets),
                                  len(measured_long), len(failures)))
sys.exit(1 if failures else 0)
