"""Is training waiting for data? :func:`diagnose` (:mod:`~colabfast.diagnosis.report`) measures it;
``colabfast doctor`` (:mod:`~colabfast.diagnosis.doctor`) says where the data should live on this machine.
"""

from __future__ import annotations

from colabfast.diagnosis.report import Report, diagnose

__all__ = ["Report", "diagnose"]
