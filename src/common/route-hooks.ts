/** A route's hooks of one kind as an array: Fastify takes one hook, an array of them or none. */
export const asList = <T>(hooks: T | T[] | undefined): T[] => (hooks === undefined ? [] : Array.isArray(hooks) ? hooks : [hooks]);
