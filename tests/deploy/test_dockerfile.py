"""The Dockerfile, without a container engine (none here: it was not
built): it is multi-stage (CUDA devel image, CUDA runtime image), every file
it COPYs from the context exists in the repository and is not excluded by
.dockerignore, every file it COPYs from the build stage is one that stage
builds, every package it names is in the Makefile's DEBIAN_PACKAGES, the
runtime packages it derives (deploy/docker/runtime-packages.sh, run here
on the built rvd and rvctl) are all dependencies of DEBIAN_PACKAGES, and
its user, paths and ports are the ones helm/ and deploy/ expect."""
import fnmatch
import os
import pathlib
import re
import shlex
import subprocess

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BUILD = pathlib.Path(os.environ.get("RVD_BUILD_DIR", "build")).resolve()


def instructions():
    """[(INSTRUCTION, argument text)] with continuations joined."""
    out, cur = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def stages():
    """[(FROM image with ARG defaults substituted, [instructions])]."""
    args, result = {}, []
    for ins, rest in instructions():
        if ins == "ARG" and not result:
            k, _, v = rest.partition("=")
            args[k] = v
        elif ins == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
            result.append((image, rest, []))
        elif result:
            result[-1][2].append((ins, rest))
    return result


def makefile_packages():
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(r"^DEBIAN_PACKAGES\s*:?=(.*)$", text, re.M)
    return set(m.group(1).split())


def dockerignore():
    return [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
            if l.strip() and not l.startswith("#")]


def ignored(path, patterns):
    """Docker's matching for the patterns used here (no ! exceptions)."""
    assert not any(p.startswith("!") for p in patterns)
    parts = path.split("/")
    for p in patterns:
        p = p.lstrip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatch(prefix, p) or (p.startswith("**/") and fnmatch.fnmatch(parts[i - 1], p[3:])):
                return True
    return False


def copies():
    """(stage index, --from or None, [sources], destination)."""
    out = []
    for i, (_, _, body) in enumerate(stages()):
        for ins, rest in body:
            if ins != "COPY":
                continue
            words = shlex.split(rest)
            src_from = None
            while words[0].startswith("--"):
                if words[0].startswith("--from="):
                    src_from = words[0].split("=", 1)[1]
                words.pop(0)
            out.append((i, src_from, words[:-1], words[-1]))
    return out


def test_multi_stage_cuda_devel_then_runtime():
    s = stages()
    assert len(s) == 2
    (build_image, build_from, _), (run_image, _, body) = s
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-devel-ubuntu[\d.]+", build_image), build_image
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-runtime-ubuntu[\d.]+", run_image), run_image
    assert build_image.split(":")[1].split("-")[0] == run_image.split(":")[1].split("-")[0]
    assert build_from.split()[-1] == "build"
    user = [rest for ins, rest in body if ins == "USER"]
    assert user == ["10001:10001"]
    values = yaml.safe_load((ROOT / "helm" / "rvd" / "values.yaml").read_text())
    assert (values["runAsUser"], values["runAsGroup"]) == (10001, 10001)
    expose = [rest for ins, rest in body if ins == "EXPOSE"]
    assert expose == [f"{values['ports']['grpc']} {values['ports']['metrics']}"]
    entry = [rest for ins, rest in body if ins == "ENTRYPOINT"]
    assert entry == ['["/opt/rvd/bin/rvd"]']
    # The chart's and the examples' args name the config where the image has it.
    assert ("config/rvd.yaml", "/etc/rvd/rvd.yaml") in {(srcs[0], dst) for _, f, srcs, dst in copies() if f is None}


def test_every_context_copy_exists_and_is_not_ignored():
    patterns = dockerignore()
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.split())
    n = 0
    for _, src_from, srcs, _ in copies():
        if src_from is not None:
            continue
        for src in srcs:
            n += 1
            path = ROOT / src
            assert path.exists(), f"COPY {src}: no such file"
            rel = src.rstrip("/")
            assert not ignored(rel, patterns), f"COPY {src}: excluded by .dockerignore"
            files = [rel] if path.is_file() else [t for t in tracked if t.startswith(rel + "/")]
            assert files and all(f in tracked or ROOT.joinpath(f).is_dir() for f in files), \
                f"COPY {src}: not in the repository (git ls-files)"
    assert n >= 10
    # What CMake needs to configure is copied: every add_subdirectory of the
    # top CMakeLists.txt.
    copied = {s.rstrip("/") for _, f, srcs, _ in copies() if f is None for s in srcs}
    for sub in re.findall(r"add_subdirectory\((\S+)\)", (ROOT / "CMakeLists.txt").read_text()):
        assert sub.split("/")[0] in copied, f"CMake's {sub} is not copied"
    for inc in re.findall(r"include\((cmake/\S+)\)", (ROOT / "CMakeLists.txt").read_text()):
        assert "cmake" in copied and (ROOT / inc).exists(), inc


def cmake_targets():
    exe, lib = set(), set()
    for f in ROOT.rglob("CMakeLists.txt"):
        if any(p.startswith("build") for p in f.relative_to(ROOT).parts):
            continue
        text = f.read_text()
        exe |= set(re.findall(r"add_executable\((\w+)", text))
        lib |= set(re.findall(r"add_library\((\w+)\s+(?:MODULE|SHARED)", text))
    return exe, lib


def test_every_build_stage_copy_is_built_there():
    (_, _, build_body), _ = stages()
    runs = " ".join(rest for ins, rest in build_body if ins == "RUN")
    targets = set(re.search(r"--target ([\w ]+?) &&", runs).group(1).split())
    exe, lib = cmake_targets()
    n = 0
    for _, src_from, srcs, _ in copies():
        if src_from != "build":
            continue
        for src in srcs:
            n += 1
            if m := re.fullmatch(r"/src/build/bin/(\w+)", src):
                assert m.group(1) in exe and m.group(1) in targets, src
            elif m := re.fullmatch(r"/src/build/lib/lib(\w+)\.so", src):
                assert m.group(1) in lib and m.group(1) in targets, src
            else:
                assert f"> {src}" in runs, f"COPY --from=build {src}: not written by the build stage"
    assert n >= 4


def test_packages_are_the_makefiles():
    allowed = makefile_packages()
    assert {"libgrpc++-dev", "cmake", "make"} <= allowed
    runs = [rest for _, _, body in stages() for ins, rest in body if ins == "RUN"]
    named = []
    for r in runs:
        for cmd in re.split(r"&&|;", r):
            words = cmd.split()
            if "apt-get" in words and "install" in words:
                pkgs = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
                if words[0] == "xargs":  # the derived runtime list
                    assert words[:3] == ["xargs", "-a", "/tmp/runtime-packages.txt"], cmd
                    continue
                named += pkgs
    assert named, "no apt-get install found: the test reads the Dockerfile wrongly"
    assert set(named) <= allowed, f"not in DEBIAN_PACKAGES: {sorted(set(named) - allowed)}"
    assert any(re.search(r"\bmake deps\b", r) for r in runs), "the build stage must run make deps"
    assert "apt-get install" in (ROOT / "Makefile").read_text() and "$(DEBIAN_PACKAGES)" in \
        (ROOT / "Makefile").read_text().split("deps:")[1].split("\n\n")[0]


def installed_dependencies(roots):
    """The installed packages that `roots` depend on, transitively."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\t${Depends}, ${Pre-Depends}\t${Provides}\n"],
        capture_output=True, text=True, check=True).stdout
    deps, providers = {}, {}
    for line in out.splitlines():
        name, dep, prov = line.split("\t")
        deps[name] = {re.split(r"[ :(]", alt.strip())[0]
                      for d in dep.split(",") for alt in d.split("|") if alt.strip()}
        for p in prov.split(","):
            if p.strip():
                providers.setdefault(re.split(r"[ (]", p.strip())[0], set()).add(name)
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        for q in {p} | providers.get(p, set()):
            if q in seen or q not in deps:
                continue
            seen.add(q)
            todo += deps[q]
    return seen


def test_runtime_packages_are_dependencies_of_the_makefiles(tmp_path):
    script = ROOT / "deploy" / "docker" / "runtime-packages.sh"
    bins = [BUILD / "bin" / "rvd", BUILD / "bin" / "rvctl"]
    module = BUILD / "lib" / "librvd_cuda.so"
    if module.exists():
        bins.append(module)
    r = subprocess.run([str(script), *map(str, bins)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    derived = set(r.stdout.split())
    assert {"libprotobuf32", "libyaml-cpp0.7", "libprometheus-cpp-core1.0"} <= derived, derived
    assert any(p.startswith("libgrpc++") for p in derived), derived
    closure = installed_dependencies(makefile_packages())
    assert derived <= closure, f"runtime packages no Makefile package depends on: {sorted(derived - closure)}"
    # Refuses what it cannot read.
    assert subprocess.run([str(script), str(tmp_path / "none")], capture_output=True).returncode != 0
