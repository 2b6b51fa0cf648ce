"""The tally of the Python test programs that CTest runs as scripts (tests/cli/plot_test.py,
python/tests/check_dump_torch.py): each failed check printed as "FAIL: <what>" and counted; at the end one line
"<name>: passed (0 failures)" or "<name>: FAILED (<n> failures)", and the exit status 1 after any failure.
"""
import sys


class Checks:
    def __init__(self, name):
        self.name = name
        self.failures = 0

    def __call__(self, cond, what):
        """Counts a failure, saying `what`, unless `cond` holds."""
        if not cond:
            print("FAIL:", what)
            self.failures += 1

    def exit(self):
        print(f"{self.name}: {'FAILED' if self.failures else 'passed'} ({self.failures} failures)")
        sys.exit(1 if self.failures else 0)
