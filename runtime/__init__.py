"""The serving-side hook (imported as aoti_farm.runtime). Never imports Ray."""
