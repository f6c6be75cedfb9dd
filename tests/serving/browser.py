"""Headless Chromium for the page test: Debian's `chromium` and `chromium-driver` (apt,
scripts/setup.sh installs them) driven by selenium (the `dev` extra), or the reason they
cannot be (the test then skips naming it).

The paths are given to selenium, so its Selenium Manager never looks for (or downloads) a
browser or driver. The window is 1000x1000 at device scale 1: an element's rect is its
place in pixels of a screenshot.
"""

import contextlib
import importlib.util
import shutil
import tempfile
from typing import Iterator

import numpy as np

WIDTH, HEIGHT = 1000, 1000


def _find(*names: str) -> str:
  for name in names:
    path = shutil.which(name)
    if path:
      return path
  return ""


def chromium_path() -> str:
  return _find("chromium", "chromium-browser", "google-chrome")


def chromedriver_path() -> str:
  return _find("chromedriver")


def missing() -> str:
  """Why a headless Chromium cannot be driven here ("" when it can)."""
  if not chromium_path() or not chromedriver_path():
    return ("Chromium or its driver is not installed (Debian: apt-get install chromium "
            "chromium-driver; scripts/setup.sh installs them)")
  if importlib.util.find_spec("selenium") is None:
    return "selenium is not installed (pip install -e .[dev])"
  return ""


@contextlib.contextmanager
def chromium() -> Iterator["object"]:
  """A selenium WebDriver of a headless Chromium of its own (a fresh profile), quit after."""
  from selenium import webdriver  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.chrome.service import Service  # pylint: disable=g-import-not-at-top
  profile = tempfile.mkdtemp(prefix="chromium-profile")
  options = webdriver.ChromeOptions()
  options.binary_location = chromium_path()
  for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                   f"--window-size={WIDTH},{HEIGHT}", "--force-device-scale-factor=1",
                   "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}"):
    options.add_argument(argument)
  driver = webdriver.Chrome(options=options, service=Service(chromedriver_path()))
  try:
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    yield driver
  finally:
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, path: str) -> np.ndarray:
  """uint8 [H, W, 3]: the window's screenshot, also written to `path` (PNG)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  data = driver.get_screenshot_as_png()
  with open(path, "wb") as f:
    f.write(data)
  return tf.io.decode_png(data, channels=3).numpy()


def region(pixels: np.ndarray, element, inset: int = 0) -> np.ndarray:
  """The part of a screenshot `element` covers (its border box shrunk by `inset` pixels)."""
  rect = element.rect
  x, y = int(round(rect["x"])) + inset, int(round(rect["y"])) + inset
  w, h = int(round(rect["width"])) - 2 * inset, int(round(rect["height"])) - 2 * inset
  return pixels[y:y + h, x:x + w]
