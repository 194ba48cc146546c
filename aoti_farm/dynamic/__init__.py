"""Shape classes: one kernel for a range of shapes (``warm --dynamic``).

* ``shapes``     -- ``ShapeClass`` and ``classes(sigs)``: signatures grouped by the dims that vary.
* ``dyncompile`` -- what a class kernel has of its own: ``dynamic_spec``, ``verify_points``,
  the serve range's ``gate``, ``ClassEntry``, hints; ``DynamicUnsupported``.
* ``stridesym``  -- the graph of a class whose strides are symbols.

Compiling a class goes through the one compile path (``aoti_farm.compile``); the
Ray-free half of ``warm --dynamic auto`` and the widen policy live there too
(``compile.dynwarm``, ``compile.widen``).  Imports only ``signature`` and ``errors``.
"""
