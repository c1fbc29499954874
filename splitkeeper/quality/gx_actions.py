"""The Data Docs action of the restart checks' Great Expectations checkpoint.

Who uses it: :func:`splitkeeper.quality.checks.run_restart_checks`, as its checkpoint's first
action. It is GE's ``UpdateDataDocsAction`` (a subclass: GE runs it before every other action, and
an action that links to the pages, ``SlackNotificationAction(notify_with=...)`` say, finds them as
it finds GE's own) building the site ONCE for every validation result of the run: GE's own builds
it once per result, index included, each build compiling the site's templates again (six suites:
2.1 s of a 2.6 s check, against 0.4 s for one build). Imported only where GE is (this module
registers the action's ``type`` with GE when it is first imported).
"""

from __future__ import annotations

from typing import Any, Literal

from great_expectations.checkpoint import UpdateDataDocsAction
from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

__all__ = ["UpdateDataDocsOnce"]


class UpdateDataDocsOnce(UpdateDataDocsAction):
    """``UpdateDataDocsAction`` with one site build for all the checkpoint's results; returns what
    GE's returns (per validation result, its page's URL per site)."""

    type: Literal["splitkeeper_update_data_docs"] = "splitkeeper_update_data_docs"  # type: ignore[assignment]

    def run(self, checkpoint_result: Any, action_context: Any = None) -> dict:
        if self._using_cloud_context:  # GX Cloud renders its own pages: GE's action as it is
            return super().run(checkpoint_result, action_context)
        identifiers: list[Any] = []
        for result_id, result in checkpoint_result.run_results.items():
            identifiers += [result_id, ExpectationSuiteIdentifier(name=result.suite_name)]
        self._build_data_docs(site_names=self.site_names, resource_identifiers=identifiers)
        pages: dict[Any, dict[str, str]] = {}
        for result_id in checkpoint_result.run_results:
            urls = self._get_docs_sites_urls(resource_identifier=result_id, site_names=self.site_names)
            pages[result_id] = {site["site_name"]: site["site_url"] for site in urls}
        return pages
