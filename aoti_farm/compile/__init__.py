"""THE compile path: build a kernel, verify it against eager, publish it.

* ``compiler``     -- ``AOTICompiler``: one signature or one shape class, built with
  AOTInductor and verified (``Compiler`` protocol, ``load_runner``, ``import_compile_path``).
* ``graph``        -- the graph a signature compiles as (``OpModule``): eager's strides,
  the float64 and layout retries' graphs, an op traced as an equivalent (``substitute``).
* ``verify``       -- the verification loop (``AOTICompiler``'s ``verify``/``verify_class``,
  the ``Verifier`` mixin), ``verify_thread_counts``, ``is_verification_refusal``.
* ``checks``       -- one case, kernel against eager (``check_case``, ``check_precision``,
  edge notes, the proxy-executor memo).
* ``faults``       -- whose fault a failed compile is (``infrastructure_error`` ->
  ``CompileInfraError``, ``own_code_error``).
* ``child``        -- the verification child (``python -m aoti_farm.compile.child --serve``).
* ``adversarial``  -- verification inputs random ones never hit; index guards.
* ``tolerance``    -- when a kernel agrees with eager.
* ``runner``       -- runners without AOTI's cross-call wait; a kernel's flat inputs.
* ``verifyserver`` -- the long-lived verification child where kernels cannot be loaded here.
* ``job``          -- lease + compile + verify + publish.
* ``dynwarm``      -- the Ray-free half of ``warm --dynamic auto``.
* ``widen``        -- the miss policy for a call outside every class range.
* ``hostprep``     -- per-host compile products built once (``python -m aoti_farm.compile.hostprep``).

Imports every lower room (``build``, ``cache``, ``speedgate``, ``dynamic``, ``startup``,
...).  Nothing is re-exported here.
"""
