"""Every benchmark of streamtrain (`streamtrain bench ...`), `bench all` and `bench report` (BENCHMARKS.md, generated
from their JSON). They sit above the services and the stack and may import any of them; nothing imports them.
`common` is what they share, `live` runs them on real processes, `registry` lists them.
"""
