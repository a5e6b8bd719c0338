import { useEffect, useState } from 'react';
import { Link } from 'react-router-dom';
import { ApiError, client, ok } from './api';

/** Campaign names by id, each read once per page load: a campaign's name never changes. */
const names = new Map<string, Promise<string | null>>();

/**
 * From the public coupon page, which each instance answers from memory: the admin view counts the
 * campaign's coupons at every read (seconds for millions, two at a time per instance), and a page of
 * a hundred rows would have queued a hundred of those ahead of the campaign pages.
 */
function nameOf(id: string): Promise<string | null> {
  let name = names.get(id);
  if (!name) {
    name = ok(client.GET('/coupons/{couponId}', { params: { path: { couponId: id } } })).then(
      (c) => c.name,
      (err: unknown) => {
        // A campaign that does not exist stays nameless; after a blip it is asked again next time.
        if (!(err instanceof ApiError && err.status === 404)) names.delete(id);
        return null;
      },
    );
    names.set(id, name);
  }
  return name;
}

/**
 * A campaign as operators know it, "#12 满100减50": the id at once, the name once read (`compact`:
 * the id alone, the name on hover, for a narrow table column). A link to the campaign's page; a
 * click on it does not also toggle the table row it sits in.
 */
export function CampaignRef({ id, compact = false }: { id: string; compact?: boolean }) {
  const [name, setName] = useState<string | null>(null);
  useEffect(() => {
    let current = true;
    void nameOf(id).then((n) => current && setName(n));
    return () => {
      current = false;
    };
  }, [id]);
  return (
    <Link to={`/campaigns/${id}`} onClick={(e) => e.stopPropagation()} data-testid={`campaign-ref-${id}`} title={name ?? undefined}>
      #{id}
      {name && !compact && ` ${name}`}
    </Link>
  );
}
