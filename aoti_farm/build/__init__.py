"""Patches and mechanisms of Inductor's C++/Triton build (each checks torch's versions).

* ``splitbuild``  -- the AOTI wrapper in two translation units (the model-independent
  half once per host); the one patch of ``CppBuilder.build``.
* ``commonobj``   -- the split build's per-host product (the common object), the text both
  halves add, and the compiler processes that build them.
* ``serialsmall`` -- tiny CPU loop nests without an OpenMP region.
* ``tritonscan``  -- a CUDA index kernel's Triton code read for its device asserts.
* ``abortscan``   -- a CPU kernel that would abort its verification, refused before its build.

Used by ``aoti_farm.compile``; imports ``config``, ``metrics``, ``security``, ``startup``.
"""
