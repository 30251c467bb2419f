package main

// authorization.k8s.io/v1 SubjectAccessReview, LocalSubjectAccessReview and
// SelfSubjectAccessReview: create-only resources, never stored, answered by the server's
// authorizer (the same chain that authorizes requests). Ported from Kubernetes v1.36:
// pkg/registry/authorization/{subjectaccessreview,localsubjectaccessreview,selfsubjectaccessreview}/rest.go,
// pkg/registry/authorization/util/helpers.go and the checks of
// pkg/apis/authorization/validation/validation.go. The field and label selectors of
// resourceAttributes are not read (RBAC never reads them either).

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
)

// reviewREST is the storage of one review kind.
type reviewREST struct {
	authz      authorizer.Authorizer
	kind       string
	namespaced bool
	newObj     func() runtime.Object
}

var (
	_ rest.Creater                  = &reviewREST{}
	_ rest.Scoper                   = &reviewREST{}
	_ rest.SingularNameProvider     = &reviewREST{}
	_ rest.GroupVersionKindProvider = &reviewREST{}
)

func (r *reviewREST) New() runtime.Object     { return r.newObj() }
func (r *reviewREST) Destroy()                {}
func (r *reviewREST) NamespaceScoped() bool   { return r.namespaced }
func (r *reviewREST) GetSingularName() string { return singular(r.kind) }
func (r *reviewREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return authorizationv1.SchemeGroupVersion.WithKind(r.kind)
}

func reviewStores(authz authorizer.Authorizer) map[string]rest.Storage {
	return map[string]rest.Storage{
		"subjectaccessreviews": &reviewREST{authz: authz, kind: "SubjectAccessReview",
			newObj: func() runtime.Object { return &authorizationv1.SubjectAccessReview{} }},
		"localsubjectaccessreviews": &reviewREST{authz: authz, kind: "LocalSubjectAccessReview", namespaced: true,
			newObj: func() runtime.Object { return &authorizationv1.LocalSubjectAccessReview{} }},
		"selfsubjectaccessreviews": &reviewREST{authz: authz, kind: "SelfSubjectAccessReview",
			newObj: func() runtime.Object { return &authorizationv1.SelfSubjectAccessReview{} }},
	}
}

// Create answers the review: Allowed when the authorizer allows, Denied when it denies
// (RBAC never denies: it allows or has no opinion), the authorizer's reason and error.
func (r *reviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, _ *metav1.CreateOptions) (runtime.Object, error) {
	var (
		attrs  authorizer.AttributesRecord
		status *authorizationv1.SubjectAccessReviewStatus
		meta   metav1.ObjectMeta
	)
	var errs field.ErrorList
	switch review := obj.(type) {
	case *authorizationv1.SubjectAccessReview:
		errs = validateReviewSpec(review.Spec.ResourceAttributes, review.Spec.NonResourceAttributes, field.NewPath("spec"))
		if len(review.Spec.User) == 0 && len(review.Spec.Groups) == 0 {
			errs = append(errs, field.Invalid(field.NewPath("spec", "user"), review.Spec.User, `at least one of user or group must be specified`))
		}
		attrs = attributesFrom(subjectOf(review.Spec), review.Spec.ResourceAttributes, review.Spec.NonResourceAttributes)
		status, meta = &review.Status, review.ObjectMeta
	case *authorizationv1.LocalSubjectAccessReview:
		errs = validateReviewSpec(review.Spec.ResourceAttributes, review.Spec.NonResourceAttributes, field.NewPath("spec"))
		if len(review.Spec.User) == 0 && len(review.Spec.Groups) == 0 {
			errs = append(errs, field.Invalid(field.NewPath("spec", "user"), review.Spec.User, `at least one of user or group must be specified`))
		}
		if review.Spec.NonResourceAttributes != nil {
			errs = append(errs, field.Invalid(field.NewPath("spec", "nonResourceAttributes"), review.Spec.NonResourceAttributes, `disallowed on this kind of request`))
		}
		namespace := genericapirequest.NamespaceValue(ctx)
		if review.Spec.ResourceAttributes != nil && review.Spec.ResourceAttributes.Namespace != namespace {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("spec.resourceAttributes.namespace must match namespace: %v", namespace))
		}
		attrs = attributesFrom(subjectOf(review.Spec), review.Spec.ResourceAttributes, review.Spec.NonResourceAttributes)
		status, meta = &review.Status, review.ObjectMeta
		meta.Namespace = ""
	case *authorizationv1.SelfSubjectAccessReview:
		errs = validateReviewSpec(review.Spec.ResourceAttributes, review.Spec.NonResourceAttributes, field.NewPath("spec"))
		u, ok := genericapirequest.UserFrom(ctx)
		if !ok {
			return nil, apierrors.NewBadRequest("no user present on request")
		}
		attrs = attributesFrom(u, review.Spec.ResourceAttributes, review.Spec.NonResourceAttributes)
		status, meta = &review.Status, review.ObjectMeta
	default:
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a %s: %#v", r.kind, obj))
	}
	// Reviews carry no metadata (ValidateSubjectAccessReview and its siblings).
	meta.ManagedFields = nil
	if !equality.Semantic.DeepEqual(metav1.ObjectMeta{}, meta) {
		errs = append(errs, field.Invalid(field.NewPath("metadata"), meta, `must be empty`))
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(authorizationv1.SchemeGroupVersion.WithKind(r.kind).GroupKind(), "", errs)
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	decision, reason, err := r.authz.Authorize(ctx, attrs)
	*status = authorizationv1.SubjectAccessReviewStatus{
		Allowed: decision == authorizer.DecisionAllow,
		Denied:  decision == authorizer.DecisionDeny,
		Reason:  reason,
	}
	if err != nil {
		status.EvaluationError = err.Error()
	}
	return obj, nil
}

// validateReviewSpec: exactly one of resourceAttributes and nonResourceAttributes.
func validateReviewSpec(res *authorizationv1.ResourceAttributes, nonRes *authorizationv1.NonResourceAttributes, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if res != nil && nonRes != nil {
		errs = append(errs, field.Invalid(path.Child("nonResourceAttributes"), nonRes, `cannot be specified in combination with resourceAttributes`))
	}
	if res == nil && nonRes == nil {
		errs = append(errs, field.Invalid(path.Child("resourceAttributes"), nonRes, `exactly one of nonResourceAttributes or resourceAttributes must be specified`))
	}
	return errs
}

// subjectOf: the user a SubjectAccessReview asks about (AuthorizationAttributesFrom).
func subjectOf(spec authorizationv1.SubjectAccessReviewSpec) user.Info {
	extra := map[string][]string{}
	for k, v := range spec.Extra {
		extra[k] = []string(v)
	}
	return &user.DefaultInfo{Name: spec.User, Groups: spec.Groups, UID: spec.UID, Extra: extra}
}

// attributesFrom: ResourceAttributesFrom and NonResourceAttributesFrom (an empty version
// matches every version).
func attributesFrom(u user.Info, res *authorizationv1.ResourceAttributes, nonRes *authorizationv1.NonResourceAttributes) authorizer.AttributesRecord {
	if res == nil {
		if nonRes == nil {
			return authorizer.AttributesRecord{User: u}
		}
		return authorizer.AttributesRecord{User: u, Path: nonRes.Path, Verb: nonRes.Verb}
	}
	version := res.Version
	if version == "" {
		version = "*"
	}
	return authorizer.AttributesRecord{User: u, Verb: res.Verb, Namespace: res.Namespace, APIGroup: res.Group,
		APIVersion: version, Resource: res.Resource, Subresource: res.Subresource, Name: res.Name, ResourceRequest: true}
}
