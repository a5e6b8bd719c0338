import { EXPLANATIONS_EN, EXPLANATIONS_ZH_CN } from '../console/src/explanations.js';
import { englishOf, EXPLANATION_KEYS } from '../src/reconciliation/explanations.js';

/** The `{names}` a console sentence puts values in, sorted. */
const placeholders = (text: string) => [...text.matchAll(/\{(\w+)\}/g)].map((m) => m[1]).sort();
const dictionaries: Record<string, Record<string, string>> = { en: EXPLANATIONS_EN, 'zh-CN': EXPLANATIONS_ZH_CN };

describe("the console's explanations of discrepancies", () => {
  it('has every key the server can send, in English and in Chinese, with the same values put in', () => {
    expect(EXPLANATION_KEYS.length).toBeGreaterThan(0);
    for (const key of EXPLANATION_KEYS) {
      const en = EXPLANATIONS_EN[`explain_${key}` as keyof typeof EXPLANATIONS_EN];
      for (const [lang, messages] of Object.entries(dictionaries))
        expect([key, lang, typeof messages[`explain_${key}`]]).toEqual([key, lang, 'string']);
      expect([key, placeholders(EXPLANATIONS_ZH_CN[`explain_${key}` as keyof typeof EXPLANATIONS_ZH_CN])]).toEqual([key, placeholders(en)]);
    }
  });

  it("says in English what the server's English says, from the same values", () => {
    for (const key of EXPLANATION_KEYS) {
      const en = EXPLANATIONS_EN[`explain_${key}` as keyof typeof EXPLANATIONS_EN];
      // Each value the server's sentence puts in, given as its own {name}, gives back the console's sentence.
      const params = Object.fromEntries(placeholders(en).map((name) => [name, `{${name}}`]));
      expect([key, englishOf({ key, params })]).toEqual([key, en]);
    }
  });

  it('has no sentence the server does not send', () => {
    const keys = EXPLANATION_KEYS.map((k) => `explain_${k}`).sort();
    for (const messages of Object.values(dictionaries)) expect(Object.keys(messages).sort()).toEqual(keys);
  });
});
