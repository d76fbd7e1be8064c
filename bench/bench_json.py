"""What the bench smoke checks share: run kvpool-bench with --json, parse its lines, fail clearly.

Each check_*_json.py runs one mode of the bench, then checks the figures its mode must print. The
common part is here: the run (a non-zero exit fails, with the bench's stderr), one JSON object a
line, the keys every line of that mode carries (and their types, where given).
"""
import json
import subprocess
import sys


class Smoke:
    """One smoke check, named as in CTest (its messages start with the name)."""

    def __init__(self, name):
        self.name = name
        self.stdout = ""
        self.stderr = ""

    def fail(self, msg, out=""):
        sys.stderr.write("%s: FAIL: %s\n" % (self.name, msg))
        if out:
            sys.stderr.write(out[-4000:] + "\n")
        sys.exit(1)

    def run(self, cmd, required, timeout):
        """Runs `cmd` and returns its figures, one dict per non-empty stdout line.

        `required`: the keys every line carries, a tuple of names or a dict of name -> type (or
        tuple of types; a bool never counts as a number).
        """
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
        self.stdout, self.stderr = proc.stdout, proc.stderr
        if proc.returncode != 0:
            self.fail("%s exited with %d" % (" ".join(cmd), proc.returncode), proc.stderr)
        types = required if isinstance(required, dict) else dict.fromkeys(required)
        figures = []
        for n, line in enumerate((l for l in proc.stdout.splitlines() if l.strip()), 1):
            try:
                f = json.loads(line)
            except ValueError as e:
                self.fail("line %d is not JSON (%s): %r" % (n, e, line))
            if not isinstance(f, dict):
                self.fail("line %d is not a JSON object: %r" % (n, line))
            missing = [k for k in types if k not in f]
            if missing:
                self.fail("line %d lacks %s: %s" % (n, missing, line))
            for key, kind in types.items():
                if kind is not None and (not isinstance(f[key], kind) or isinstance(f[key], bool)):
                    self.fail("line %d: %r has the wrong type: %s" % (n, key, line))
            figures.append(f)
        if not figures:
            self.fail("no output", proc.stderr)
        return figures
