"""Failure drills: the catalogue (:mod:`.catalogue`: fault, expected alerts, other-path alerts and
report panels per drill), the runner that injects a fault and times each hop to the page
(:mod:`.runner`), and the soak that checks a healthy fleet pages nobody (:mod:`.soak`)."""
