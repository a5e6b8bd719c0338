import { chromium, type Browser } from 'playwright-core';

/** Debian's Chromium (CHROMIUM_PATH overrides), headless, with no background traffic of its own. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}
