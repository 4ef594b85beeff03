"""Failure drills: the catalogue (:mod:`.catalogue`: fault, expected and allowed alerts and report
panels per drill), the runner that injects a fault and times each hop to the page (:mod:`.runner`),
each page's bound on the running stack (:mod:`.bounds`), and the soak that checks a healthy fleet
pages nobody (:mod:`.soak`)."""
