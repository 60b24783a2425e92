from harness.render.job import RenderContext, current_context, render_job  # noqa: F401
